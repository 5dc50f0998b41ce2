"""The training plan knobs write into, and the context they are checked against."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pydantic import ConfigDict, model_validator
from pydantic.dataclasses import dataclass as validated


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
    seq_len: int = 0               # tokens per sequence of the recipe (0: not known here)

    def data_parallel_ranks(self, cfg: dict) -> int:
        """Ranks that each hold a slice of the batch: the world over every parallel degree the knobs set
        (spaces.parallel: pipeline stages, tensor and context parallel)."""
        from .parallel import data_parallel_ranks, degrees
        return data_parallel_ranks(self.world_size, degrees(cfg))


# A plan stored in the first layout kept each engine's settings under a name of its own and some knobs' settings in
# fields of their own or under "extra"; Plan reads those into today's sections (nothing stored is rewritten)
_ENGINE_SECTIONS = {"deepspeed": "zero", "fsdp": "fsdp", "pipeline": "pipeline"}
_KNOB_FIELDS = ("sdpa_backend",)


@validated(config=ConfigDict(extra="forbid"))
class Plan:
    """How one trial trains: one typed object from resolve() through Ray, the worker, the memory and step-time
    models, the store (to_dict: its JSON) and the export (from_dict).

    Its fields are what the shared machinery reads: the engine and its own settings, the precision, the batch
    split, the parallel degrees, and how the model runs (attention, checkpointing, compile, the loss) where the
    model build and the memory and step-time models must know it. Every other knob keeps its setting in `knobs`
    under its own name and reads it back in its own file: adding a knob never edits this class."""

    engine: str = "ddp"                       # ddp (plain on one rank) | deepspeed | fsdp | pipeline
    engine_config: dict = field(default_factory=dict)  # the engine's own settings (DeepSpeed: zero_optimization;
    #                                           FSDP2: reshard_after_forward; pipeline: stages, schedule, chunks per
    #                                           rank, microbatches), written by the knobs that choose the engine
    precision: str = "bf16-mixed"             # fp32 | bf16-mixed | fp16-mixed
    # the dtype of the parameters the optimizer updates (the master weights), of their gradients and of the
    # optimizer's states: the model is built in it whatever its config.json's torch_dtype says (the precision knob)
    master_dtype: str = "float32"
    micro_batch_size: int = 1
    micro_batch_probe: bool = False           # micro_batch_size=max: step down from micro_batch_size on OOM
    grad_accum: int = 1                       # micro-batches per optimizer step and rank
    mesh: dict = field(default_factory=dict)  # parallel degrees above 1 besides data parallel: "pp"|"cp"|"tp" -> degree
    attn_implementation: str = "sdpa"         # the model's attention (transformers' attn_implementation)
    checkpoint_every: int = 0                 # activation checkpointing: every n-th layer (0 = off, 1 = all)
    compile: bool = False
    compile_scope: str = "auto"               # with compile: layers (each decoder layer on its own) | model
    loss_kernel: str = "eager"                # eager | compiled (the loss compiled on its own) | fused_linear
    tf32: bool = True
    env: dict = field(default_factory=dict)    # environment variables of the trial's worker processes
    knobs: dict = field(default_factory=dict)  # every other knob's own setting, by the knob's name
    notes: list = field(default_factory=list)  # what a knob could not do as asked, and why (shown with the trial)

    @model_validator(mode="before")
    @classmethod
    def _stored_before(cls, d: Any) -> Any:
        """A stored plan dict as today's fields: one stored before the sections has its engine's settings moved into
        engine_config, "extra" and the knobs' old fields into knobs; one from before `mesh` existed takes its
        pipeline stages from its pipeline section, one from before `compile_scope` compiled the whole model. A
        field no longer planned (compile_mode, of the first records) is left out."""
        if not isinstance(d, dict):
            return d
        d = {k: v for k, v in d.items() if k in _FIELDS or k in _LEGACY}
        if not any(k in d for k in _LEGACY):
            return d
        sections = {name: d.pop(name, None) for name in _ENGINE_SECTIONS.values()}
        d.setdefault("engine_config", sections.get(_ENGINE_SECTIONS.get(d.get("engine", "ddp"))) or {})
        d.setdefault("compile_scope", "model")  # before compile_scope existed, compile compiled the whole model
        if "mesh" not in d:
            stages = int((sections["pipeline"] or {}).get("stages", 1) or 1)
            d["mesh"] = {"pp": stages} if stages > 1 else {}
        knobs = dict(d.pop("extra", None) or {})
        knobs.update({k: d.pop(k) for k in _KNOB_FIELDS if k in d})
        d["knobs"] = {**knobs, **d.get("knobs", {})}
        return d

    @property
    def sequences_per_call(self) -> int:
        """Sequences one forward/backward call of the engine takes (an engine that takes several micro-batches per
        call, the pipeline, says how many in its engine_config's "microbatches")."""
        return self.micro_batch_size * self.engine_config.get("microbatches", 1)

    def replace(self, **changes) -> "Plan":
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (a record's "plan")."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        """The plan back from to_dict's data, or from a plan stored in an earlier form."""
        return cls(**cls._stored_before(d))


_FIELDS = frozenset(f.name for f in fields(Plan))
_LEGACY = frozenset({*_ENGINE_SECTIONS.values(), "extra", *_KNOB_FIELDS})
