from ..errors import ConfigError
from ..knob import REGISTRY, Knob, register
from ..roles import Export, Search


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (1 and n included)."""
    return [d for d in range(1, n + 1) if n % d == 0]


class MicroBatchSearch(Search):
    def measured(self, value, plan):
        return plan.micro_batch_size if value == "max" and plan else value  # the micro-batch the probe settled on


class MicroBatchExport(Export):
    def fields(self, fmt, plan, device):
        return {"per_device_train_batch_size": plan.micro_batch_size} if fmt == "hf" else {}


@register
class MicroBatchSize(Knob):
    """Sequences per forward/backward on one rank (max: the largest that fits, probed in one process); accumulation = per-rank batch / micro-batch."""  # noqa: E501 - its first line is the description `trainscout knobs` prints (spaces.knob.description)

    name = "micro_batch_size"
    default = "auto"  # the largest divisor of the per-rank batch that is <= 8
    choices = (1, 2, 4, 8, 16, 32, 64, 128, "max")
    search = MicroBatchSearch(micro_batch=True, column=1)
    export = MicroBatchExport()

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().lower() in ("auto", "max"):
            return raw.strip().lower()
        if isinstance(raw, str):
            try:
                raw = int(raw.strip())
            except ValueError:
                raise ConfigError(self.name, f"micro_batch_size={raw} is not a whole number: use a positive integer or "
                                             "auto")
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
            return raw
        raise ConfigError(self.name, f"micro_batch_size={raw} is not allowed: use a positive integer or auto")

    def per_rank_batch(self, cfg, ctx) -> int:
        dp = ctx.data_parallel_ranks(cfg)
        if not isinstance(ctx.global_batch, int) or ctx.global_batch < 1:
            raise ConfigError("global_batch", f"global_batch={ctx.global_batch} is not allowed: give a positive "
                                              "integer")
        if ctx.global_batch % dp:
            raise ConfigError("global_batch", f"global_batch={ctx.global_batch} does not split over {dp} "
                                              f"data-parallel ranks: choose a multiple of {dp}")
        return ctx.global_batch // dp

    @staticmethod
    def in_flight(cfg) -> int:
        """Micro-batches one forward/backward call takes: the pipeline's micro-batches, else 1."""
        return cfg.get("pipeline_microbatches", 1) if cfg.get("pipeline_stages", 1) > 1 else 1

    def per_call_batch(self, cfg, ctx) -> int:
        """Sequences of one forward/backward call on a rank: the per-rank batch over the pipeline's micro-batches
        in flight. ConfigError when those do not split it (e.g. more in flight than the rank has sequences)."""
        per_rank, n = self.per_rank_batch(cfg, ctx), self.in_flight(cfg)
        if per_rank % n:
            stages, dp = cfg.get("pipeline_stages", 1), ctx.data_parallel_ranks(cfg)
            fits = [m for m in REGISTRY["pipeline_microbatches"].choices if m >= stages and per_rank % m == 0]
            fix = f"choose pipeline_microbatches={fits[-1]}" if fits else "choose fewer pipeline_stages"
            raise ConfigError("pipeline_microbatches", f"pipeline_microbatches={n} does not split the per-rank batch "
                                                       f"{per_rank} (global_batch {ctx.global_batch} / {dp} "
                                                       f"data-parallel ranks): {fix}, or a global_batch that is a "
                                                       f"multiple of {n * dp}")
        return per_rank // n

    def concrete(self, value, cfg, ctx):
        if value == "auto":
            return max(d for d in divisors(self.per_call_batch(cfg, ctx)) if d <= 8)
        return value

    def check(self, value, cfg, ctx):
        if value == "max":
            if ctx.world_size != 1 or cfg.get("zero_stage", 0) or self.in_flight(cfg) > 1:
                raise ConfigError(self.name, "micro_batch_size=max probes micro-batches in one process, which needs "
                                             "one rank without DeepSpeed or a pipeline: give a number, or use one "
                                             "rank, zero_stage=0 and pipeline_stages=1")
            return
        per_call, n = self.per_call_batch(cfg, ctx), self.in_flight(cfg)
        if per_call % value:
            near = ", ".join(str(d) for d in sorted(divisors(per_call), key=lambda d: abs(d - value))[:2])
            what = f" × {n} pipeline micro-batches" if n > 1 else ""
            raise ConfigError(self.name, f"micro_batch_size={value}{what} does not divide the per-rank batch "
                                         f"{per_call * n} (global_batch {ctx.global_batch} / "
                                         f"{ctx.data_parallel_ranks(cfg)} data-parallel ranks): choose a divisor "
                                         f"such as {near}")

    def apply(self, plan, value, cfg, ctx):
        per_call = self.per_call_batch(cfg, ctx)
        if value == "max":  # start at the largest divisor; the worker steps down on out-of-memory
            plan.micro_batch_probe = True
            value = max(d for d in divisors(per_call) if d <= 128)
        plan.micro_batch_size = value
        plan.grad_accum = per_call // value
