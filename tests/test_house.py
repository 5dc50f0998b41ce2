"""The library stays readable (bench/house_metrics.py): no function over 60 lines, no private name of trainscout used
across modules, no getattr reads of a knob's protocol, the metric names declared once, Knob's core small."""
import bench_script  # tests/bench_script.py



def test_the_library_is_within_each_limit():
    house = bench_script.load("house_metrics")
    found = house.measure()
    over = {k: found[k] for k, limit in house.LIMITS.items() if len(found[k]) > limit}
    assert not over, "\n".join(f"{k}: {len(v)} (limit {house.LIMITS[k]}): {v[:10]}" for k, v in over.items())


def test_the_measures_find_what_they_count(tmp_path):
    house = bench_script.load("house_metrics")
    lines = "\n".join(f"    x = {i}" for i in range(61))
    source = (f"from .memory import _counts\nfrom trainscout.trial import models\n\n\ndef long():\n{lines}\n\n\n"
              "def reads(knob):\n    return getattr(knob, 'costs'), models._gpt_neox, row['tokens_per_s']\n")
    (tmp_path / "m.py").write_text(source)
    house.ROOT = str(tmp_path)
    found = house.scan("m.py")
    assert [len(found[k]) for k in ("long_functions", "private_imports", "knob_getattr", "tokens_per_s_files")] == \
        [1, 2, 1, 1], found
