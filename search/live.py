"""The live table of `trainscout search`: one row per finished trial, and a progress line after each."""
from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING

from trainscout.search.outcomes import NUMBERS, failed_quality
from trainscout.search.summary import clock, days_or_hours
from trainscout.search.trainable import FREE, METRIC
from trainscout.spaces import fmt
from trainscout.store import one_line
from trainscout.trial.status import NOT_COUNTED, Status

if TYPE_CHECKING:
    from trainscout.search.space import Space


_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x1f\x7f]")  # ANSI colours (Ray's), tabs and other controls


def plain(text: str) -> str:
    """text as the terminal shows it one column a character: ANSI colour codes dropped, a tab or other control
    character a space (a row is cut to the width by its characters, and a tab takes up to 8 columns)."""
    return _CONTROL.sub(lambda m: "" if m.group().startswith("\x1b") else " ", text)


def cut(line: str, width: int | None) -> str:
    """line within width (None: as it is), its end cut with '…' (a row whose fixed columns alone pass a narrow
    terminal's width)."""
    return line if width is None or len(line) <= width else line[:max(1, width - 1)] + "…"


class Printer:
    """The live table: one row per finished trial, with the best so far, and why a trial failed or did not run."""

    def __init__(self, space: Space, stream=None, *, total: int | None = None, budget_s: float | None = None,
                 ranks: int = 1, unit: str = "GPU"):
        self.space, self.stream, self.best, self.n = space, stream, None, 0
        # rows that count toward --trials (not refused or pruned before running, nor lost: NOT_COUNTED)
        self.counted = 0
        self.to_stderr = stream is sys.stderr  # --json: the table goes to stderr, stdout holds the JSON alone
        self.header = False
        # the progress line: trials to go (None: until the budget), the budget, the ranks each trial holds
        self.total, self.budget_s, self.ranks, self.unit = total, budget_s, ranks, unit
        self.t0, self.device_s = time.time(), 0.0

    def progress(self) -> str:
        """One line: trials done of the total, elapsed and ETA, best so far, device-seconds the trials held."""
        elapsed = time.time() - self.t0
        eta = []
        if self.total and self.counted:
            eta.append(elapsed / self.counted * max(0, self.total - self.counted))
        if self.budget_s:
            eta.append(max(0.0, self.budget_s - elapsed))
        left = f"ETA {clock(min(eta))}" if eta else "ETA -"
        done = f"{self.counted}/{self.total}" if self.total else f"{self.counted}"
        done += " trials" + (f" (+{self.n - self.counted} refused, pruned or lost, not counted)"
                             if self.n > self.counted else "")
        best = f"{self.best:,.0f} tok/s" if self.best else "-"
        return (f"    {done}, {clock(elapsed)} elapsed, {left}, best {best}, "
                f"{self.device_s:,.0f} {self.unit}-s measured")

    def __getstate__(self):  # Ray Tune pickles its callbacks; an open stream is not picklable
        return dict(self.__dict__, stream=None)

    def __call__(self, trial, r: dict):
        out = self.stream or (sys.stderr if self.to_stderr else sys.stdout)
        from trainscout.analysis.terminal import fit_fields, terminal_width
        width = terminal_width(out)  # a terminal: the row within its width, whole knob=value fields (a pipe: all)
        if not self.header:
            print(cut(f"{'#':>3} {'trial':10} {'status':8} {'tokens/s':>11} {'run':>11} {'best tok/s':>11}  config",
                      width), file=out)
            self.header = True
        self.n += 1
        self.counted += r.get("status") not in FREE and r.get("status") not in NOT_COUNTED
        v = r.get(METRIC) or 0.0
        if r.get("status") == Status.OK and not failed_quality(r) and (self.best is None or v > self.best):
            self.best = v
        days = r.get("projected_days")
        days = days_or_hours(days) if days else "-"
        searched = [f"{k}={fmt(trial.config[k])}" for k, vs in self.space.domains.items()
                    if len(vs) > 1 and k in trial.config]
        # *: served from the store; ~: measured beside other trials on its CPU or GPU (kept apart, not served)
        status = r.get("status", "?") + ("*" if r.get("cached") else "") + ("~" if r.get("shared") else "")
        why = f"  ({plain(one_line(r['error'], 120))})" if r.get("error") and r.get("status") != Status.OK else ""
        why += f"  ({plain(r['note'])})" if r.get("note") else ""  # served from another search's measurement
        self.device_s += (r.get("wall_s") or 0.0) * self.ranks
        # one reading of each number: a trial without one (invalid, pruned, oom, crash, ...) shows "-", not 0; a
        # stopped trial's figure is its best timed step (what ASHA compared), said so
        figure = f"{v:>11,.0f}" if r.get("status") in (Status.OK, Status.STOPPED) else f"{'-':>11}"
        if r.get("status") == Status.STOPPED:
            why += "  (stopped by ASHA: tokens/s of its best timed step)"
        if failed_quality(r):  # trains another model: never the best, and no bar for ASHA (searcher.make_scheduler)
            why += "  (quality failed: not best)"
        best = f"{self.best:>11,.0f}" if self.best is not None else f"{'-':>11}"
        head = f"{NUMBERS.get(trial.trial_id, self.n - 1):>3} {trial.trial_id[-10:]:10} {status:8} {figure} " \
               f"{days:>11} {best}  "
        room = 0 if width is None else width - len(head) - 10  # 10: the "+N more" of the fields left out
        if width is not None and why and room >= 20:  # the reason first: cut to what is left beside the columns
            why = why if len(why) <= room else why[:room - 1] + "…"
            row = fit_fields(head, searched, width - len(why))
        elif width is not None and why:  # no room beside them: the reason on the next line, cut to the width
            row = fit_fields(head, searched, width)
            why = "\n      " + (why.strip() if len(why.strip()) <= width - 6 else why.strip()[:width - 7] + "…")
        else:
            row = fit_fields(head, searched, width)
        print("\n".join(cut(line, width) for line in (row + why).split("\n")), file=out, flush=True)
        progress = self.progress()
        if width is not None and len(progress) > width:  # whole words within the terminal's width
            import textwrap
            progress = "\n".join(cut(ln, width) for ln in textwrap.wrap(progress.strip(), width,
                                                                          initial_indent="    ",
                                                                          subsequent_indent="      "))
        print(progress, file=out, flush=True)
