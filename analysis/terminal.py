"""Lines within a terminal's width (the live table, the summary, results, knobs): whole fields kept or left out, a
pipe or a file gets every field. No pandas: the live table imports this while a search runs."""
from __future__ import annotations


def terminal_width(stream=None) -> int | None:
    """The terminal's columns where stream (default: stdout) is a terminal; None for a pipe or a file, which get
    every table at full width."""
    import shutil
    import sys
    stream = stream or sys.stdout
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):  # closed, or no isatty (a StringIO)
        return None
    return shutil.get_terminal_size().columns


def fit_fields(head: str, fields: list[str], width: int | None, sep: str = " ") -> str:
    """head, then as many whole fields as fit in width, the rest counted ("+3 more"); width None: all of them."""
    line = head + sep.join(fields)
    if width is None or len(line) <= width:
        return line
    out = head
    for i, f in enumerate(fields):
        more = f" +{len(fields) - i - 1} more" if i < len(fields) - 1 else ""
        if len(out) + len(f) + len(more) + (len(sep) if out != head else 0) > width:
            return (out.rstrip() + f" +{len(fields) - i} more")
        out += (sep if out != head else "") + f
    return out


def wrap_fields(fields: list[str], width: int | None, indent: str, sep: str = " ") -> list[str]:
    """Whole fields on lines of at most width (each line starting with indent); width None: one line."""
    if width is None:
        return [indent + sep.join(fields)]
    lines, cur = [], indent
    for f in fields:
        if cur != indent and len(cur) + len(sep) + len(f) > width:
            lines.append(cur)
            cur = indent
        cur += (sep if cur != indent else "") + f
    return lines + [cur]


def fit_text(text: str, width: int | None) -> str:
    """Every line of text within width (None: as it is). A longer line of columns (separated by two or more spaces)
    keeps its columns up to the last one that starts at least 20 columns before the edge and wraps what follows by
    words beneath that column where two lines hold it, else on the lines below, indented four more than the line; a
    line of one field wraps by words, indented two more than it."""
    import re
    import textwrap
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip(" "))
        starts = [m.end() for m in re.finditer(r" {2,}", line) if lead < m.end() <= width - 20]
        col = starts[-1] if starts else lead
        rest = textwrap.wrap(line[col:], width - col, break_on_hyphens=False) or [""]
        if col > lead and len(rest) <= 2:  # beneath its column
            out.append(line[:col] + rest[0])
            out.extend(" " * col + r for r in rest[1:])
        elif col > lead:  # a long last column: on the lines below, the whole width, indented
            col = max(m.end() for m in re.finditer(r" {2,}", line) if lead < m.end() <= width)  # the columns that fit
            out.append(line[:col].rstrip())
            out.extend(textwrap.wrap(line[col:], width, initial_indent=" " * (lead + 4),
                                     subsequent_indent=" " * (lead + 4), break_on_hyphens=False))
        else:
            out.extend(textwrap.wrap(line, width, subsequent_indent=" " * (lead + 2), break_on_hyphens=False))
    return "\n".join(out)


class FitStream:
    """A terminal stream whose every complete line is written through fit_text at the terminal's width (the search
    command's stdout: the start lines, the live table and the summary within the width). What is written without a
    newline waits for it, or for flush(), which writes it as it is."""

    def __init__(self, stream, width: int):
        self.stream, self.width, self._part = stream, width, ""

    def write(self, text: str) -> int:
        lines = (self._part + text).split("\n")
        self._part = lines.pop()
        for line in lines:
            self.stream.write(fit_text(line, self.width) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._part:
            self.stream.write(self._part)
            self._part = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name):  # fileno, encoding, ...: the terminal's
        return getattr(self.stream, name)
