"""matplotlib figures as inline SVG for one HTML document: Agg, text kept as text, ids prefixed per plot, hover
titles (SVG <title>) on drawn artists."""
from __future__ import annotations

import io
import itertools
import re

from .formatting import escape

_PLOT = itertools.count(1)


def tip(fig, artist, title: str) -> None:
    """A hover title (an SVG <title>) on any drawn artist: a bar segment, a line."""
    tips = fig.__dict__.setdefault("_tips", {})
    gid = f"tip{len(tips)}"
    tips[gid] = title
    artist.set_gid(gid)


def dot(fig, ax, x, y, title: str, **kw) -> None:
    """One plotted point with a hover title (an SVG <title>), so that a dot can be matched to its table row."""
    tip(fig, ax.scatter([x], [y], **kw), title)


def to_svg(fig) -> str:
    """A figure as inline SVG: text kept as text, its ids prefixed for this plot, its hover titles in place."""
    import matplotlib
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: no glyph definitions per plot
        fig.savefig(buf, format="svg", bbox_inches="tight")
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>", "", s, flags=re.S)
    s = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", s, count=2)  # namespaces are implied in HTML
    # the plots share one document: give each plot's ids (and the references to them) its own prefix
    p = f"p{next(_PLOT)}-"
    s = re.sub(r'(\sid=")([^"]+")', rf"\g<1>{p}\2", s)
    s = re.sub(r'(url\(#|href="#)', rf"\g<1>{p}", s)
    tips = fig.__dict__.get("_tips", {})
    return re.sub(rf'(<g id="{p}(tip\d+)">)', lambda m: f"{m[1]}<title>{escape(tips.get(m[2], ''))}</title>", s)


def figure(w: float, h: float):
    """A matplotlib figure of w x h inches on the Agg backend, laid out constrained."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    return fig


def bar_label(ax, x: float, y: float, text: str, size: float) -> None:
    """Text just right of a bar's end (an offset, since SVG text drops leading spaces)."""
    ax.annotate(text, (x, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=size)


def note(ax, text: str) -> None:
    """Text in place of a plot: the axes hidden."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True, color="#555")
    ax.set_axis_off()


def thousands_axis(ax) -> None:
    """The y axis labelled in whole numbers with thousands separated."""
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
