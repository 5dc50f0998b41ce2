"""The report of a results store: the best configurations with tokens/s, MFU, projected days and cost; where a
step's time goes; measured peak memory beside the memory model's components; the hardware side by side; what failed
and why; which knobs mattered (Optuna's own PED-ANOVA evaluator on a study rebuilt in memory from the table) and
controlled comparisons of measurements that differ in one knob. `report.html` is self-contained: plots are inline
SVG (matplotlib, Agg), no script, no stylesheet or image from anywhere else.

One module per job, each importing only those above it in this list: formatting.py (how a value, a row and a status
are written), analysis.py (the numbers: analyse), breakdown.py (step time, memory model, one-knob comparisons),
text.py (the terminal summary and shared sentences), svg.py (matplotlib figures as inline SVG), plots.py (the
figures), page.py (report.html). The names below are the package's interface (`report.analyse`, `report.render_html`).
"""
from .analysis import Analysis, analyse, knob_importance, measured, pareto_front, progress
from .breakdown import (MEMORY_PARTS, STEP_PARTS, VIEW_TOP, WORKSPACE, knob_pairs, memory_empty_reason, memory_rows,
                        pair_groups, step_breakdown)
from .formatting import (NO_SEARCH, STATUS_COLOR, STATUS_TEXT, config_text, contributed, days, gpu_s_text, label, num,
                         search_name, usd, where)
from .page import (CSS, FEW_TRIALS, TOP, export_command, memory_section, pairs_section, reason, render_html, report,
                   step_section, trial_table, write_html)
from .plots import (COLORS, MEMORY_COLORS, STEP_COLORS, plot_cost, plot_importance, plot_knob_pairs, plot_knob_values,
                    plot_memory, plot_pareto, plot_progress, plot_step_breakdown, plot_timeline)
from .text import progress_text, spent_text, summary, tie_text

__all__ = [
    "Analysis", "analyse", "knob_importance", "measured", "pareto_front", "progress",
    "MEMORY_PARTS", "STEP_PARTS", "VIEW_TOP", "WORKSPACE", "knob_pairs", "memory_empty_reason", "memory_rows",
    "pair_groups", "step_breakdown",
    "NO_SEARCH", "STATUS_COLOR", "STATUS_TEXT", "config_text", "contributed", "days", "gpu_s_text", "label", "num",
    "search_name", "usd", "where",
    "CSS", "FEW_TRIALS", "TOP", "export_command", "memory_section", "pairs_section", "reason", "render_html", "report",
    "step_section", "trial_table", "write_html",
    "COLORS", "MEMORY_COLORS", "STEP_COLORS", "plot_cost", "plot_importance", "plot_knob_pairs", "plot_knob_values",
    "plot_memory", "plot_pareto", "plot_progress", "plot_step_breakdown", "plot_timeline",
    "progress_text", "spent_text", "summary", "tie_text",
]
