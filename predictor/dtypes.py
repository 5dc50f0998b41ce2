"""What a trial really trained in: the dtypes of the parameters its optimizer updated (the master weights), of their
gradients and of the optimizer's states, read from the live optimizer at its first step, not from the plan.

Why: a config.json's "torch_dtype" can make transformers build 16-bit weights under a mixed-precision label, and the
trial then trains something else than its label says (docs/trial.md). A record says what ran, and a trial whose
dtypes are not its label's crashes, naming them (DtypeMismatch), instead of measuring something else."""
from __future__ import annotations

PARTS = ("weights", "gradients", "optimizer")


class DtypeMismatch(RuntimeError):
    """The optimizer updated other dtypes than the plan names."""


def _names(dtypes) -> str | None:
    names = sorted({str(d).replace("torch.", "") for d in dtypes})
    return "+".join(names) or None


def state_kind(v):
    """What an optimizer state tensor holds, as the record names it: its dtype, or for torchao's quantised states
    (OptimState8bit, OptimState4bit, OptimStateFp8: codes and block scales whose `dtype` is only an appearance, the
    weights') their kind: "8bit", "4bit", "fp8". A DTensor's (FSDP2) is its local tensor's."""
    local = v.to_local() if hasattr(v, "to_local") else v
    kind = type(local).__name__
    return kind.removeprefix("OptimState").lower() if kind.startswith("OptimState") else local.dtype


def watch(optimizers) -> dict:
    """A dict filled at the first step of each torch optimizer: "weights" (the parameters it updates), "gradients"
    (theirs, read before the step) and "optimizer" (its floating-point state tensors, read after it). Hooks are
    removed once they have seen a step (a step GradScaler skips for an overflow is not one)."""
    seen: dict = {}
    found: dict = {part: set() for part in PARTS}
    pending = list(optimizers)
    handles: list = []

    def pre(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        found["weights"].update(p.dtype for p in params)
        found["gradients"].update(p.grad.dtype for p in params if p.grad is not None)

    def post(opt, args, kwargs):
        found["optimizer"].update(state_kind(v) for state in opt.state.values() for v in state.values()
                                  if hasattr(v, "dtype") and v.dtype.is_floating_point and v.dim() > 0)
        if opt in pending:
            pending.remove(opt)
        if not pending:  # every optimizer stepped once: what they hold is what the trial trains in
            seen.update({part: _names(found[part]) for part in PARTS})
            for h in handles:
                h.remove()

    for opt in optimizers:
        handles += [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
    return seen


def expected(plan) -> dict:
    """The dtypes the plan's label names: its master dtype for the weights and their gradients; for the optimizer's
    states what its optimizer spec says they are (trial.engines.base.optimizer_spec, through the knobs' optimizer
    hooks: the master dtype, or optimizer_state's "bfloat16", "8bit", "4bit", "fp8")."""
    from trainscout.trial.engines.base import optimizer_spec
    return {"weights": plan.master_dtype, "gradients": plan.master_dtype, "optimizer": optimizer_spec(plan).states}


def _matches(seen: str, want: str, master: str) -> bool:
    """Whether seen names the label's dtype: the same, or (states another than the weights') that one beside the
    master dtype, which torchao keeps for the states it does not quantise (< 4096 values or not a whole block)."""
    return seen == want or (want != master and want in seen.split("+") and set(seen.split("+")) <= {want, master})


def check(seen: dict, plan) -> None:
    """DtypeMismatch when what the optimizer stepped differs from the plan's label (nothing seen yet: nothing to
    check)."""
    want = expected(plan)
    wrong = {part: seen[part] for part in PARTS if seen.get(part) and not _matches(seen[part], want[part],
                                                                                     plan.master_dtype)}
    if wrong:
        raise DtypeMismatch(
            f"precision={plan.precision} trains {plan.master_dtype} weights and gradients and {want['optimizer']} "
            "optimizer states, "
            f"but the optimizer stepped {', '.join(f'{part} in {d}' for part, d in wrong.items())}: the trial "
            "measured another configuration than its label and is not a measurement of it")


# a memory saver that keeps fp32 states is preferred to one that lowers them while its predicted step is at most
# this many times the fastest fitting saver's, so that a far slower fp32 saver is not answered first (docs/trial.md)
KEEP_STATE_COST = 2.0


def prefer(fitting: list[tuple]):
    """The saver taken among those that fit, each (lowers_state, predicted step seconds, the savers' rank, ...): the
    fastest predicted that keeps fp32 states where one is within KEEP_STATE_COST of the fastest of all, else the
    fastest (search/start.fits and the atlas' predictions alike)."""
    fastest = min(f[1] for f in fitting)
    keeping = [f for f in fitting if not f[0] and f[1] <= KEEP_STATE_COST * fastest]
    return min(keeping or fitting, key=lambda f: f[1:3])


def lowers_state(plan) -> bool:
    """Whether the plan keeps the master weights or the optimizer's states below fp32 (precision=bf16, 8-bit or 4-bit
    AdamW states): a memory saver that does is taken only where none that keeps them fits within KEEP_STATE_COST of
    its speed (prefer: search.start.fits, the atlas), as it trains other numbers than the recipe's fp32 masters
    (DeepSpeed's or FSDP2's 16-bit compute keeps them)."""
    return any(d != "float32" for d in expected(plan).values())

