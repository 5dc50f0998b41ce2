from ..errors import ConfigError
from ..knob import Knob, register
from ..roles import Runtime

# schedule -> model chunks (virtual stages) per pipeline rank, as torch.distributed.pipelining runs them
CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 2}
# schedule -> idle micro-batch slots of a rank per schedule step, per stage beyond the first (the bubble; the
# step-time model's, trial/engines/pipeline.py schedule): GPipe and 1F1B wait stages - 1 slots of one micro-batch's
# stage time (Huang et al. 2019; Narayanan et al. 2021: bubble fraction (p-1)/(m+p-1)); interleaving v model
# chunks per rank cuts it to (p-1)/v (Narayanan et al. 2021); interleaved zero-bubble splits the backward into
# input and weight gradients and fills two thirds of what remains with the latter (Qi et al. 2023, ZB-H1: 1/3 of
# 1F1B's bubble), (p-1)/(3v)
BUBBLE = {"gpipe": 1.0, "1f1b": 1.0, "interleaved_1f1b": 1 / CHUNKS["interleaved_1f1b"],
          "zero_bubble": 1 / (3 * CHUNKS["zero_bubble"])}


@register
class PipelineStages(Knob):
    """Pipeline parallelism: split the layers over this many ranks (torch.distributed.pipelining); data parallel over the rest."""  # noqa: E501 - its first line is the description `trainscout knobs` prints (spaces.knob.description)

    name = "pipeline_stages"
    default = 1
    choices = (1, 2, 4, 8)
    requires = {"zero_stage": (0,), "fsdp": ("off",), "compile": (False,)}
    runtime = Runtime(mesh_dim="pp")

    def check(self, value, cfg, ctx):
        if value == 1:
            return
        if ctx.world_size % value:
            raise ConfigError(self.name, f"pipeline_stages={value} does not divide the {ctx.world_size} ranks: "
                                         f"choose a divisor of {ctx.world_size} or pipeline_stages=1")
        chunks = value * CHUNKS[cfg["pipeline_schedule"]]
        if ctx.num_layers % chunks:
            raise ConfigError(self.name, f"pipeline_stages={value} with pipeline_schedule={cfg['pipeline_schedule']} "
                                         f"splits the layers into {chunks} equal parts but the model has "
                                         f"{ctx.num_layers}: choose fewer stages or pipeline_schedule=1f1b")

    def apply(self, plan, value, cfg, ctx):
        if value > 1:
            plan.engine = "pipeline"
            plan.engine_config = {"stages": value, "schedule": cfg["pipeline_schedule"],
                             "chunks": CHUNKS[cfg["pipeline_schedule"]],
                             "microbatches": cfg["pipeline_microbatches"]}


@register
class PipelineSchedule(Knob):
    """Pipeline schedule: GPipe, 1F1B, interleaved 1F1B or interleaved zero-bubble (2 model chunks per rank)."""

    name = "pipeline_schedule"
    default = "1f1b"
    choices = tuple(CHUNKS)
    requires = {"pipeline_stages": (2, 4, 8)}

    def apply(self, plan, value, cfg, ctx):
        pass  # pipeline_stages writes the pipeline's plan


@register
class PipelineMicrobatches(Knob):
    """Micro-batches in flight per pipeline step (each of micro_batch_size sequences); at least the stage count."""

    name = "pipeline_microbatches"
    default = 4
    choices = (2, 4, 8, 16, 32)
    requires = {"pipeline_stages": (2, 4, 8)}

    def check(self, value, cfg, ctx):
        stages = cfg["pipeline_stages"]
        if stages > 1 and value < stages:
            raise ConfigError(self.name, f"pipeline_microbatches={value} is fewer than pipeline_stages={stages} "
                                         f"(the schedule would idle most ranks): choose >= {stages}")
        if stages > 1 and CHUNKS[cfg["pipeline_schedule"]] > 1 and value % stages:
            raise ConfigError(self.name, f"pipeline_microbatches={value} with pipeline_schedule="
                                         f"{cfg['pipeline_schedule']} must be a multiple of pipeline_stages={stages}")

    def apply(self, plan, value, cfg, ctx):
        pass  # pipeline_stages writes the pipeline's plan
