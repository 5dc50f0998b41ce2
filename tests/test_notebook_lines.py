"""The library is no lab notebook (issue 58): comment and docstring lines that carry a measured number, a date, the
history of earlier work or a bench log's path stay a small share of the library's lines (bench/notebook_lines.py
counts them); the measurements live in docs/ and docs/constants.csv, whose values are the code's
(bench/constants_table.py)."""
import bench_script  # tests/bench_script.py

MAX_SHARE = 0.003  # the target


def test_notebook_lines_share():
    count = bench_script.load("notebook_lines").count()
    top = ", ".join(f"{path} {n}" for path, n in list(count["files"].items())[:10])
    assert count["share"] <= MAX_SHARE, (f"{count['flagged']} of {count['lines']} library lines "
                                         f"({count['share']:.2%}) carry notebook text; the most: {top}")


def test_notebook_lines_finds_what_it_counts():
    nb = bench_script.load("notebook_lines")
    source = ('"""Step time.\n\nMeasured 15.35 ms on one H100 (bench/data/gpu-2026-12-06-s23/x.log)."""\n'
              'X = 1  # torch 2.13, >=2.6, "9.0": versions and quoted values are no measurements\n'
              'Y = "53 GB/s"  # a string in code is never read\n'
              '# 4,764 tokens/s, session 22\n')
    flagged = {line: kinds for line, text in nb.prose(source) if (kinds := nb.flags(text))}
    assert set(flagged) == {3, 6}
    assert {"number", "unit", "bench log", "date"} <= set(flagged[3]) and {"count", "unit", "date"} <= set(flagged[6])


def test_constants_table_is_the_code():
    assert bench_script.load("constants_table").check() == []
