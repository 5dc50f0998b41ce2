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
