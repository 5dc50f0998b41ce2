"""The commands that measure one configuration or use one: knobs, trial, estimate, verify (and verify --quality),
train."""
from __future__ import annotations

import json
import sys
import textwrap

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

from .flags import gpu_memory, input_file, out_folder, parse_sets, recipe_kwargs


# --- commands -------------------------------------------------------------------------------------------------
def cmd_knobs(a) -> int:
    """`trainscout knobs`: the table of knobs (-v: the module each comes from; -q: without the hint)."""
    from trainscout import spaces
    rows = []
    for k in spaces.all_knobs():
        req = ", ".join(f"{o}={'|'.join(spaces.fmt(v) for v in vals)}" for o, vals in k.requires.items()) or "-"
        rows.append({"name": k.name, "domain": spaces.domain_text(k), "default": spaces.fmt(k.default),
                     "requires": req, "description": spaces.description(k), "module": type(k).__module__})
    if a.json:
        for r, k in zip(rows, spaces.all_knobs()):
            r.update(numerics_entry(k))
        print(json.dumps(rows, indent=2))
        return 0
    columns = ("name", "domain", "default", "requires") + (("module",) if a.verbose else ())
    from trainscout.analysis.terminal import terminal_width
    width = terminal_width()  # a terminal: every line within it, whole fields wrapped; a pipe: one line a knob
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    below = []  # columns too wide beside the others: said under the knob's line, as "requires: ..."
    while width is not None and sum(widths.values()) + 2 * len(widths) > width - 30 and len(widths) > 1:
        below.insert(0, list(widths)[-1])
        widths.pop(below[0])
    left = sum(widths.values()) + 2 * len(widths)
    indent = left if width is None or width - left >= 30 else 4  # too narrow beside the columns: below them
    print(("  ".join(c.upper().ljust(widths[c]) for c in widths)
           + ("  DESCRIPTION" if indent == left else "")).rstrip())
    for r in rows:
        row = "  ".join(r[c].ljust(widths[c]) for c in widths) + "  "
        if width is None:
            print(row + r["description"])
            continue
        text = " ".join([f"{c}: {r[c]}." for c in below if r[c] != "-"] + [r["description"]])
        lines = textwrap.wrap(text, max(20, width - indent), break_on_hyphens=False) or [""]
        if indent == left:
            print(row + lines[0])
            lines = lines[1:]
        else:
            print(row.rstrip())
        for line in lines:
            print(" " * indent + line)
    if not a.quiet:
        hint = "Set a knob with --set NAME=VALUE. A knob with requirements may only leave its default when they hold."
        print("\n" + ("\n".join(textwrap.wrap(hint, width)) if width else hint))
    return 0


NUMERICS_CONTEXT = "one H100/H200 (cuda, capability 9.0), every other knob at its default"


def numerics_entry(knob) -> dict:
    """What `knobs --json` says of a knob's numerics: its reference value (what the quality gate's reference runs)
    and, for each of its choices whose `numerics(value, cfg, ctx)` says it trains other numbers, why; evaluated in a
    default context (NUMERICS_CONTEXT); a value that trains the same numbers there but not where one other knob
    leaves its default (tf32=true under precision=fp32) is in `numerics_when`, naming that setting."""
    from trainscout import spaces
    ctx = spaces.Context(world_size=1, device="cuda", capability="9.0", num_layers=2, global_batch=8)
    cfg = {k.name: k.default for k in spaces.all_knobs()}

    def why(value, c):
        try:
            return knob.numerics.why(value, dict(c, **{knob.name: value}), ctx)
        except Exception as e:  # noqa: BLE001 - a plugin's numerics that fails is said, not hidden
            return f"numerics() failed: {type(e).__name__}: {e}"
    changes, when = {}, {}
    for value in knob.choices:
        if w := why(value, cfg):
            changes[spaces.fmt(value)] = w
            continue
        for other in spaces.all_knobs():  # the same value where one other knob leaves its default (tf32 under fp32)
            hit = next(((o, w) for o in other.choices if other.name != knob.name and o != other.default
                        and (w := why(value, dict(cfg, **{other.name: o})))), None)
            if hit:
                when[spaces.fmt(value)] = {"when": f"{other.name}={spaces.fmt(hit[0])}", "why": hit[1]}
                break
    return {"reference": spaces.fmt(spaces.reference_value(knob)), "numerics": changes, "numerics_when": when,
            "numerics_context": NUMERICS_CONTEXT}


def cmd_trial(a) -> int:
    """`trainscout trial`: measure one configuration; exit 1 when its outcome is a failure."""
    from trainscout.trial import execute, prepare
    input_file("--model", a.model)
    spec = prepare(a.model, parse_sets(a.set), device=a.device, workers=a.workers, steps=a.steps, warmup=a.warmup,
                   measure_accum=a.measure_accum, fault=a.inject_fault, **recipe_kwargs(a))
    record = execute(spec, timeout=a.timeout, address=a.address, one_node=a.one_node)
    if a.json:
        print(json.dumps(record.to_dict()))
    else:
        print_trial(record, verbose=a.verbose)
    return 0 if record.ok else 1


def print_trial(r, verbose: bool = False) -> None:
    """A trial's Record, as the `trial` command prints it (verbose: a failed trial's ranks' stderr tail too)."""
    cfg = " ".join(f"{k}={v}" for k, v in r.config.items())
    print(f"trial {r.trial_id}  model {r.model}  device {r.device} x{r.world_size}  status {r.status}")
    print(f"config   {cfg}")
    m = r.metrics
    if not m:
        print(f"error    {r.error}")
        if verbose and r.stderr_tail:
            print("stderr   the ranks' last lines:\n" + textwrap.indent(r.stderr_tail, "    "))
        return
    rec = r.recipe
    fpt = f"{m['flops_per_token'] / 1e9:.2f} GFLOPs per token ({m.get('flops_convention', 'dense-6N')}: "\
          f"{m['active_params'] / 1e6:,.1f} M active matmul parameters)" if m.get("active_params") else ""
    mfu = (f"{m['mfu']:.3f}, HFU {m['hfu']:.3f}" if m.get("hfu") is not None else f"{m['mfu']:.3f}") \
        if m["mfu"] is not None else "n/a (no GPU peak known)"
    mfu = f"{mfu}; {fpt}" if fpt else mfu
    rows = [
        ("tokens/s", f"{m[TOKENS_PER_S]:,.0f}"),
        ("step", f"{m['step_s']:.4f} s projected for {rec['global_batch']} x {rec['seq_len']} tokens "
                 f"({r.grad_accum} micro-batches of {r.micro_batch}; measured "
                 f"{r.measured_accum} per step: {m['measured_step_s']:.4f} s)"),
        ("phases", f"micro-batch {m['micro_batch_s'] * 1e3:.2f} ms, last (syncs) {m['last_micro_batch_s'] * 1e3:.2f} "
                   f"ms, optimizer {m['optimizer_s'] * 1e3:.2f} ms"),
        ("spread", f"{m['step_spread'] * 100:.1f} % over {r.timed_steps} steps, {m['rank_spread'] * 100:.1f} % "
                   f"between ranks (slowest rank {m['slowest_rank']})"),
        ("memory", f"{m['peak_memory_gib']:.2f} GiB peak per rank"),
        ("MFU", mfu),
        ("run", f"{m['projected_days']:.2f} days for {rec['total_steps']:,} steps"),
        ("overhead", f"build{' and probe' if r.probe else ''} {m['build_s']:.1f} s"
                     + (f" (model and engine {m['model_s']:.1f} s)" if m.get("model_s") else "")
                     + f", warm-up {m['warmup_s']:.1f} s"
                     + (f" (torch.compile {m['compile_s']:.1f} s of build and warm-up)" if m.get("compile_s") else "")
                     + (f", quality gate {m['gate_s']:.1f} s" if m.get("gate_s") else "")
                     + f", trial wall {r.wall_s:.1f} s"),
    ]
    from trainscout.trial.contention import label
    if shared := label(m):  # other trials on the node shared its CPU or GPU (trial.contention)
        rows.append(("shared", f"{shared} shared its device during the timed steps: slower than alone, never served "
                               "from a store; measure it alone"))
    if r.probe:  # micro_batch_size=max: what the probe tried, and the micro-batch below (or why not)
        tried = ", ".join(f"{mbs} {status}" for mbs, status in r.probe)
        if r.probe_compared and len(r.probe_compared) > 1:
            below = "; measured " + ", ".join(f"{mbs}: {t:,.0f} tokens/s" for mbs, t in r.probe_compared) + \
                    " (the faster is the record)"
        elif m.get("alloc_retries") == 0:
            below = "; the micro-batch below not measured: no allocator retry in the timed steps"
        else:
            below = ""
        from trainscout.spaces import micro_batch
        rows.insert(2, ("probe", f"{micro_batch().name}=max tried {tried}{below}"))
    for note in (r.plan.notes if r.plan else []):
        rows.append(("note", note))
    for k, v in rows:
        print(f"{k:9}{v}")


def _calibration_pairs(memory, records, a, gpu: str | None) -> list:
    """estimate --calibrate's (record, peak) pairs: the store's measured GPU peaks, of the GPU kind asked where given
    (gpu: asked_kind's answer, "H200" is "NVIDIA H200"; a GPU that is no kind by its exact name). ConfigError (exit 2)
    where fewer than the fit's 3 are left, naming the GPUs the store has."""
    from trainscout.trial.gpus import gpu_kind
    pairs = memory.calibration_pairs(records, None)
    if gpu:
        pairs = [(r, p) for r, p in pairs if (gpu_kind(r.m.get("gpu")) or str(r.m.get("gpu"))).lower() == gpu.lower()]
    if len(pairs) < 3:
        have = sorted({str(r.m.get("gpu")) for r, _ in memory.calibration_pairs(records, None)})
        raise ConfigError("--calibrate", f"--calibrate {a.calibrate}: {len(pairs)} measured GPU peak(s)"
                                         + (f" of {a.gpu}" if a.gpu else "") + " there, a calibration needs 3 "
                                         f"(GPUs measured there: {', '.join(have) or 'none'}): give --gpu one of "
                                         "them, another store, or leave --calibrate out")
    return pairs


def cmd_estimate(a) -> int:
    """Predicted peak memory per rank, without a GPU; calibrated on a store's measurements of that GPU."""
    from trainscout.predictor import memory
    from trainscout.trial import prepare
    from .lookups import host_memory
    capacity = None if a.gpu_memory is None else gpu_memory(a.gpu_memory)
    host_capacity = None if a.host_memory is None else host_memory(a.host_memory)
    input_file("--model", a.model)
    records = None
    if a.calibrate:
        from trainscout.analysis.table import store_of
        records = store_of(a.calibrate, create=False).measurements()
    hw, kind, facts, installed = _estimate_box(a, records)
    spec = prepare(a.model, parse_sets(a.set), workers=a.workers, hw=hw, installed=installed, **recipe_kwargs(a))
    cal = None
    if a.calibrate:
        cal = memory.fit(_calibration_pairs(memory, records, a, kind))
    comp = memory.components(spec)
    total = memory.predict(spec, cal)
    host = memory.host_peak(spec)
    # the GPU: the prediction at the micro-batch shown against all of its memory, estimate's own question (a search
    # launches a trial up to memory.MARGIN over it and takes a start point within FIT_SHARE: memory.refusal's shares)
    fits = None if capacity is None else total <= capacity
    # the host by the rule a search prunes its trials by (memory.refusal; lookup's predictions obey it): a
    # micro_batch_size=max probe at micro-batch 1, the least it tries (its candidates each within the rule too)
    host_why = None if host_capacity is None else (memory.refusal(spec, None, host_capacity) or (None,))[0]
    if host_why:
        fits = False
    if a.json:  # the same exit status as the text: 1 when it does not fit
        print(json.dumps({"config": spec.config, "components_gib": {k: v / memory.GiB for k, v in comp.items()},
                          "host_gib": {k: v / memory.GiB for k, v in host.items()},
                          "predicted_gib": total / memory.GiB, "calibration": cal,
                          "capacity_gib": capacity / memory.GiB if capacity else None, "fits": fits,
                          "host_need_gib": memory.host_need(host) / memory.GiB,
                          "host_capacity_gib": host_capacity / memory.GiB if host_capacity else None,
                          "host_refusal": host_why,
                          "assumed": {"capability": hw["capability"], "packages": sorted(installed),
                                      "gpu_known": facts is not None}}))
        return 1 if fits is False else 0
    _print_estimate(a, spec, (comp, total, host), cal, capacity, host_capacity, host_why, facts)
    return 1 if fits is False else 0


def _estimate_box(a, records: list | None) -> tuple[dict, str | None, tuple | None, frozenset]:
    """(hw, the GPU kind, its facts, the packages assumed installed) of the GPU box estimated for, not this machine:
    --gpu's compute capability where it is known (fp8 needs sm_89), else a Hopper's, and every package a knob runs
    on (liger-kernel for the fused linear loss, torchao for fp8)."""
    from trainscout.spaces import all_knobs
    from trainscout.trial.gpus import gpu_facts
    kind = None
    if a.gpu:  # a kind by exact identity, or with --calibrate a GPU of that store that is no kind, by its name
        from trainscout.trial.gpus import asked_kind
        kind = asked_kind(a.gpu, "--gpu", tuple(sorted({str(r.m.get("gpu")) for r in records or []
                                                        if r.m.get("gpu") and not gpu_facts(r.m.get("gpu"))})))
    facts = gpu_facts(kind) if kind else None
    hw = {"device": "cuda", "gpu_count": a.workers, "gpu": a.gpu, "capability": facts[1] if facts else "9.0"}
    installed = frozenset(p for k in all_knobs() for p in k.runtime.packages)
    return hw, kind, facts, installed


def _print_estimate(a, spec, predicted: tuple, cal: dict | None, capacity: float | None, host_capacity: float | None,
                    host_why: str | None, facts) -> None:
    """estimate's text: the components per rank, the prediction, the host's memory, what was assumed, the verdicts;
    predicted: (the components, their predicted total, the host's parts)."""
    from trainscout.predictor import memory
    comp, total, host = predicted
    print(f"model {spec.model}  ranks {a.workers}  config " + " ".join(f"{k}={v}" for k, v in spec.config.items()))
    for k, v in comp.items():
        print(f"  {k:12} {v / memory.GiB:8.2f} GiB")
    how = (f"calibrated on {cal['n']} measured peaks: {cal['a']:.2f}·states + {cal['b']:.2f}·activations + "
           f"{cal['c'] / memory.GiB:.2f} GiB") if cal else "analytic sum + 1 GiB workspace"
    print(f"  {'predicted':12} {total / memory.GiB:8.2f} GiB per rank ({how})")
    print("  host memory, all ranks: " + ", ".join(f"{k} {v / memory.GiB:.1f}" for k, v in host.items())
          + f" GiB: {memory.host_need(host) / memory.GiB:.1f} GiB at the peak")
    if not facts:
        print("  assumed: a GPU of compute capability 9.0 (give --gpu NAME for another), with every knob's packages "
              "installed")
    if capacity:
        verdict = "fits" if total <= capacity else "does NOT fit"
        print(f"  {verdict} in {capacity / memory.GiB:.1f} GiB ({100 * total / capacity:.0f} %)")
    if host_capacity:
        least = " at micro-batch 1, the least the probe tries" if spec.plan.micro_batch_probe else ""
        print(f"  host: does NOT fit: {host_why}" if host_why else
              f"  host: fits in {host_capacity / memory.GiB:.0f} GiB less {memory.MARGIN:.0%}{least} (a search's rule)")


def cmd_verify(a) -> int:
    """`trainscout verify`: train a stored configuration for N full steps; measured against projected step time."""
    from trainscout.analysis.verify import verify
    if a.quality is not None:
        return verify_quality(a)
    r = verify(a.source, key=a.trial, steps=a.steps, warmup=a.warmup, timeout=a.timeout, address=a.address,
               runner=a.runner, global_batch=a.global_batch)
    if a.json:
        print(json.dumps(r))
    elif r["status"] != Status.OK:
        print(f"verify {r['key'][:12]} ended {r['status']}: {r['error']}")
    else:
        by = {"trainscout": "trainscout's workers", "hf": "a stock HF Trainer + trainscout.runtime.hf.prepare",
              "accelerate": "accelerate launch + a stock HF Trainer + trainscout.runtime.hf.prepare"}[r["runner"]]
        print(f"verify {r['key'][:12]}  {r['model']}  {r['steps']} full optimizer steps in {by}  ({r['gpu'] or 'cpu'})")
        if r.get("global_batch", r.get("recipe_global_batch")) != r.get("recipe_global_batch"):
            print(f"  at --global-batch {r['global_batch']} (the recipe's is {r['recipe_global_batch']}: projected "
                  f"step {r['recipe_projected_step_s']:.2f} s); the projection below is the measurement's at this "
                  "batch")
        if r.get("command"):
            print(f"  ran: {r['command']}")
        print(f"  projected step {r['projected_step_s']:.4f} s   measured median {r['measured_step_s']:.4f} s "
              f"(mean {r['mean_step_s']:.4f} s)   measured/projected {r['ratio']:.3f}")
        print(f"  tokens/s projected {r['projected_tokens_per_s']:,.0f}  measured {r['measured_tokens_per_s']:,.0f}")
        if r.get("seed_method_step_s"):
            print(f"  the seed paper's timer (one unsynchronised micro-batch x accumulation) on the same steps: "
                  f"{r['seed_method_step_s']:.4f} s = {r['seed_method_ratio']:.3f} x measured")
    return 0 if r["status"] == Status.OK else 1


def verify_quality(a) -> int:
    """`trainscout verify --quality STEPS`: the configuration and its reference trained on real text, compared."""
    import math

    from trainscout.analysis.quality import TOLERANCE, WINDOW, verify_quality as run
    if a.runner != "trainscout":
        raise ConfigError("--runner", "--quality trains in trainscout's workers: leave --runner out")
    # the verdict is a confidence interval over the window (the last WINDOW of the steps): fewer than 3 steps there give
    # none worth the name (2 steps stored "verified" on 2 single-step blocks)
    least = next(n for n in range(1, 10_000) if math.ceil(WINDOW * n) >= 3)
    if a.quality < least:
        raise ConfigError("--quality", f"--quality {a.quality}: too short to verify: the comparison's interval is over "
                                       f"the last {WINDOW:.0%} of the steps and needs 3 steps there: give --quality "
                                       f"{least} or more (500: the default of a real check)")
    r = run(a.source, key=a.trial, steps=a.quality, seeds=a.seeds, global_batch=a.global_batch, seq_len=a.seq_len,
            timeout=a.timeout, address=a.address)
    # exit 0: verified (or the same model); 1: failed (a run ended badly or the losses differ) or inconclusive
    code = 0 if r["verdict"] == "same" or (r.get("status") == "ok" and r["verdict"] == "verified") else 1
    if a.json:
        print(json.dumps(r))
        return code
    print(f"verify --quality {r['key'][:12]}  {r['model']}: {r['verdict']}")
    if r.get("status") != "ok":
        print(f"  {r['why']}")
        return code
    changed = ", ".join(f"{k} ({why})" for k, why in r["changes"].items())
    ref = " ".join(f"{k}={v}" for k, v in r["reference"].items())
    loss = r["loss"]
    print(f"  changes the numerics: {changed}; reference: {ref}")
    print(f"  {r['steps']} steps x {r['global_batch']} x {r['seq_len']} tokens of the shipped corpus "
          f"({r['epochs']:.2f} epochs of {r['corpus_tokens']:,} tokens), {r['seeds']} seed(s), the same weights and "
          "batches")
    print(f"  loss over the last {r['window']} steps: {loss['candidate']:.4f} vs the reference's "
          f"{loss['reference']:.4f} ({loss['rel_diff']:+.2%}, 95 % interval {loss['ci95'][0]:+.2%} .. "
          f"{loss['ci95'][1]:+.2%}; verified within +{TOLERANCE:.0%})")
    sp = r["speed"]
    eff = r["token_efficiency"]
    print(f"  tokens/s {sp['candidate_tokens_per_s']:,.0f} vs {sp['reference_tokens_per_s']:,.0f} = {sp['ratio']:.3f}x "
          f"({sp['source']})")
    if eff is not None:
        print(f"  tokens to equal loss: {eff:.3f}x (reached at step {r['steps_to_equal_loss']}); speed at equal loss "
              f"{r['speed_at_equal_loss']:.3f}x")
    else:
        print("  the reference never reached the candidate's final loss: no speed at equal loss")
    if r["verdict"] == "failed":
        why = r.get("why") or "the loss is not within +" + format(TOLERANCE, ".0%") + " of the reference"
        print(f"  failed: {why}")
    return code


def cmd_train(a) -> int:
    """`trainscout train`: train with an exported configuration (a progress bar on stderr unless -q or --json)."""
    from tqdm import tqdm

    from trainscout.trial.train import train
    out_folder("--out", a.out)
    for flag, path in (("--config", a.config), ("--data", a.data), ("--model", a.model)):
        input_file(flag, path)
    if a.data_dtype is not None and a.data is None:  # it was read as nothing at all (synthetic tokens)
        raise ConfigError("--data-dtype", f"--data-dtype {a.data_dtype} without --data: it says how a --data file is "
                                          "written; give --data FILE, or leave --data-dtype out for synthetic tokens")
    bars = []  # made at the first step: a refusal before training (the data file, the config) stays one line

    def on_step(m):
        if not bars:
            bars.append(tqdm(total=a.steps, unit="step", dynamic_ncols=True, disable=a.json or a.quiet,
                             file=sys.stderr))
        bar = bars[0]
        bar.update(m["step"] - bar.n)
        loss = f"{m['loss']:.3f}" if m.get("loss") is not None else "-"
        bar.set_postfix_str(f"loss {loss}  {m[TOKENS_PER_S]:,.0f} tok/s")
    r = train(a.config, model=a.model, steps=a.steps, data=a.data, data_dtype=a.data_dtype or "uint16", out=a.out,
              workers=a.workers, device=a.device, timeout=a.timeout, address=a.address, on_step=on_step,
              save_dtype=a.save_dtype, **recipe_kwargs(a))
    for bar in bars:
        bar.close()
    if a.json:
        print(json.dumps(r))
    elif r["status"] == Status.OK:
        m = r["metrics"]
        print(f"trained {r['model']} for {r['steps']} steps on {r['data'] or 'synthetic tokens'}: final loss "
              f"{m['loss']:.4f}, {m[TOKENS_PER_S]:,.0f} tokens/s; checkpoint (transformers) in {r['checkpoint']}")
    else:
        print(f"training ended {r['status']}: {r['error']}")
    return 0 if r["status"] == Status.OK else 1
