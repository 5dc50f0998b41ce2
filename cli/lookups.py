"""The commands that read measurements without a GPU: lookup, atlas, report."""
from __future__ import annotations

import json
import os
import sys

from trainscout.spaces import ConfigError

from .flags import gpu_memory, input_file, out_folder


def lookup_models(values: list[str]) -> list[str]:
    """--model, repeatable and comma-separated; a pattern (pythia-*) names the built-in models it matches."""
    import fnmatch

    from trainscout.trial.models import model_names
    out = []
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            if any(c in item for c in "*?[") and not os.path.exists(item):
                hits = [m for m in model_names() if m != "tiny" and fnmatch.fnmatch(m, item)]
                if not hits:
                    raise ConfigError("--model", f"--model {item} matches no built-in model: use e.g. 'pythia-*' "
                                                 f"({', '.join(model_names())})")
                out += hits
            else:
                out.append(item)
    return list(dict.fromkeys(out))


def host_memory(text: str) -> float:
    """--host-memory: a positive size with a unit, in bytes (--gpu-memory's rule, its own flag named)."""
    try:
        return gpu_memory(text)
    except ConfigError:
        raise ConfigError("--host-memory", f"--host-memory {text} is not a size: give a positive size with a unit, "
                                           "e.g. 128GiB or 512GB (GiB, GB, MiB or MB)") from None


def cmd_lookup(a) -> int:
    """`trainscout lookup`: measured best configurations from the atlas, else a labelled prediction; exit 1 when a
    --db file had refused rows (each printed with its reason)."""
    from trainscout.atlas import db
    from trainscout.atlas.lookup import lookup
    from trainscout.atlas.render import render, render_summary
    for path in a.db or []:
        input_file("--db", path)
    models = lookup_models(a.model)
    capacity = gpu_memory(a.gpu_memory) / 2**30 if a.gpu_memory else None
    host = host_memory(a.host_memory) / 2**30 if a.host_memory else None
    atlas = db.load(a.db)
    refused = [(layer.name, *r) for layer in atlas.layers for r in layer.refused]
    for name, n, key, why in refused:
        print(f"trainscout: refused: {name} line {n} (key {key[:12]}): {why}", file=sys.stderr)
    answers = [lookup(atlas, m, gpu=a.gpu, gpus=a.gpus, global_batch=a.global_batch, budget=a.budget,
                      gpu_memory_gib=capacity, top=a.top, host_memory_gib=host) for m in models]
    from trainscout.analysis.terminal import fit_text, terminal_width
    width = terminal_width()  # a terminal: every line within its width; a pipe: whole lines
    if a.json:
        print(json.dumps(answers[0] if len(answers) == 1 else answers))
    elif len(answers) == 1 or a.verbose:
        print(fit_text("\n\n".join(render(x, provenance=not a.quiet) for x in answers), width))
    else:
        print(fit_text(render_summary(answers), width))
        for x in answers:
            if x.get("predicted"):
                print(fit_text(f"measure {x['model']}: {x['predicted']['search_command']}", width))
        if not a.quiet:
            print(fit_text("(one --model for its configurations, provenance and the predictions' leave-one-out "
                           "error; -v: all of them)", width))
    return 1 if refused else 0


def cmd_atlas(a) -> int:
    """`trainscout atlas`: the whole atlas (shipped + the stores and files given) as one self-contained HTML page;
    exit 1 when a file had refused rows (each printed with its reason)."""
    from trainscout.atlas import db, page
    for path in a.sources:
        input_file("DB", path)
    out_folder("--out", a.out)
    atlas = db.load(a.sources)
    refused = [(layer.name, *r) for layer in atlas.layers for r in layer.refused]
    for name, n, key, why in refused:
        print(f"trainscout: refused: {name} line {n} (key {key[:12]}): {why}", file=sys.stderr)
    path = page.write(atlas, a.out)
    print(f"atlas: {path} ({sum(len(x.rows) for x in atlas.layers)} rows, "
          f"{len(atlas.model.get('predictions', {}))} predicted models; {os.path.getsize(path):,} bytes)")
    return 1 if refused else 0


def cmd_report(a) -> int:
    """`trainscout report`: print the analysis' summary and write report.html."""
    from trainscout.analysis.report import analyse, summary, write_html
    out = a.out if a.out is not None else (a.source if "://" not in a.source else "report")
    out_folder("--out", out)
    input_file("--prices", a.prices)
    analysis = analyse(a.source, a.prices)
    print(summary(analysis))
    print(f"report: {write_html(analysis, out)}")
    return 0
