"""The training plan knobs write into, and the context they are checked against."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Context:
    """What a configuration is checked against: the box, the model and the recipe."""

    world_size: int = 1            # ranks (one per GPU, or CPU workers)
    device: str = "cpu"            # "cpu" or "cuda"
    num_layers: int = 1            # decoder layers of the model
    global_batch: int = 1          # sequences per optimizer step, all ranks together
    installed: frozenset = frozenset()  # optional packages present (e.g. "flash_attn"), as knobs' `packages` name them
    capability: str = ""           # the GPU's CUDA compute capability ("9.0" on an H100/H200), "" without a GPU
    model_config: dict = field(default_factory=dict)  # the transformers config of the model, as a dict

    def data_parallel_ranks(self, cfg: dict) -> int:
        """Ranks that each hold a slice of the batch: the world over every parallel degree the knobs set
        (spaces.parallel: pipeline stages, tensor and context parallel)."""
        from .parallel import data_parallel_ranks, degrees
        return data_parallel_ranks(self.world_size, degrees(cfg))


@dataclass
class Plan:
    """How one trial trains: the engine and its settings. JSON-serialisable; the worker only reads this."""

    engine: str = "ddp"                       # ddp (plain on one rank) | deepspeed | fsdp | pipeline
    precision: str = "bf16-mixed"             # fp32 | bf16-mixed | fp16-mixed
    micro_batch_size: int = 1
    micro_batch_probe: bool = False           # micro_batch_size=max: step down from micro_batch_size on OOM
    grad_accum: int = 1                       # micro-batches per optimizer step and rank
    zero: dict = field(default_factory=dict)  # DeepSpeed "zero_optimization" section
    fsdp: dict = field(default_factory=dict)  # FSDP2 fully_shard settings
    pipeline: dict = field(default_factory=dict)  # stages, schedule, chunks (per rank), microbatches
    mesh: dict = field(default_factory=dict)  # parallel degrees above 1 besides data parallel: "pp"|"cp"|"tp" -> degree
    checkpoint_every: int = 0                 # activation checkpointing: every n-th layer (0 = off, 1 = all)
    compile: bool = False
    compile_scope: str = "auto"               # with compile: layers (each decoder layer on its own) | model
    loss_kernel: str = "eager"                # eager | compiled (the loss compiled on its own)
    tf32: bool = True
    attn_implementation: str = "sdpa"
    sdpa_backend: str = "auto"                # the only scaled_dot_product_attention kernel enabled (auto: all)
    env: dict = field(default_factory=dict)    # environment variables of the trial's worker processes
    extra: dict = field(default_factory=dict)  # knobs without a field here (plugins, new knobs): name -> setting
    notes: list = field(default_factory=list)  # what a knob could not do as asked, and why (shown with the trial)

    @property
    def sequences_per_call(self) -> int:
        """Sequences one forward/backward call of the engine takes (a pipeline step takes all its micro-batches)."""
        return self.micro_batch_size * self.pipeline.get("microbatches", 1)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (a record's "plan")."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        """The plan back from to_dict's data."""
        return cls(**d)
