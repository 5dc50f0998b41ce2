from ..errors import ConfigError
from ..knob import Knob, register


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@register
class MicroBatchSize(Knob):
    """Sequences per forward/backward on one rank (max: the largest that fits, probed in one process); accumulation = per-rank batch / micro-batch."""

    name = "micro_batch_size"
    default = "auto"  # the largest divisor of the per-rank batch that is <= 8
    choices = (1, 2, 4, 8, 16, 32, 64, 128, "max")

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().lower() in ("auto", "max"):
            return raw.strip().lower()
        if isinstance(raw, str):
            try:
                raw = int(raw.strip())
            except ValueError:
                raise ConfigError(self.name, f"micro_batch_size={raw} is not a whole number: use a positive integer or auto")
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
            return raw
        raise ConfigError(self.name, f"micro_batch_size={raw} is not allowed: use a positive integer or auto")

    def per_rank_batch(self, cfg, ctx) -> int:
        dp = ctx.data_parallel_ranks(cfg)
        if ctx.global_batch % dp:
            raise ConfigError("global_batch", f"global_batch={ctx.global_batch} does not split over {dp} "
                                              f"data-parallel ranks: choose a multiple of {dp}")
        return ctx.global_batch // dp

    @staticmethod
    def in_flight(cfg) -> int:
        """Micro-batches one forward/backward call takes: the pipeline's micro-batches, else 1."""
        return cfg.get("pipeline_microbatches", 1) if cfg.get("pipeline_stages", 1) > 1 else 1

    def concrete(self, value, cfg, ctx):
        if value == "auto":
            per_call = self.per_rank_batch(cfg, ctx) // self.in_flight(cfg)
            return max([d for d in divisors(per_call) if d <= 8] or [1])
        return value

    def check(self, value, cfg, ctx):
        if value == "max":
            if ctx.world_size != 1 or cfg.get("zero_stage", 0):
                raise ConfigError(self.name, "micro_batch_size=max probes micro-batches in one process, which needs "
                                             "one rank without DeepSpeed: give a number, or use one rank and zero_stage=0")
            return
        per_rank, n = self.per_rank_batch(cfg, ctx), self.in_flight(cfg)
        if per_rank % (value * n):
            near = ", ".join(str(d) for d in sorted(divisors(max(1, per_rank // n)), key=lambda d: abs(d - value))[:2])
            what = f" × {n} pipeline micro-batches" if n > 1 else ""
            raise ConfigError(self.name, f"micro_batch_size={value}{what} does not divide the per-rank batch {per_rank} "
                                         f"(global_batch {ctx.global_batch} / {ctx.data_parallel_ranks(cfg)} "
                                         f"data-parallel ranks): choose a divisor such as {near}")

    def apply(self, plan, value, cfg, ctx):
        if value == "max":  # start at the largest divisor; the worker steps down on out-of-memory
            plan.micro_batch_probe = True
            value = max(d for d in divisors(self.per_rank_batch(cfg, ctx) // self.in_flight(cfg)) if d <= 128)
        plan.micro_batch_size = value
        plan.grad_accum = self.per_rank_batch(cfg, ctx) // (value * self.in_flight(cfg))
