"""The parallel dimensions of a trial (torchtitan's ParallelDims): data, pipeline, context and tensor parallel degrees,
and the torch DeviceMesh over them where torch.distributed runs.

A knob declares the mesh dimension its value is the degree of (`Runtime.mesh_dim`); `degrees(cfg)` reads them,
resolve() writes them into `Plan.mesh`, and `ParallelDims.of(plan, world)` is the one place the rest (engines,
transforms, the worker, the memory model) learns the degrees from: data parallel is what the others leave of the
world. Importing this module imports no torch; `mesh()` builds the DeviceMesh once per object, where it is asked for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Plan

# mesh dimensions, outermost first, as torchtitan orders them but with the pipeline inside data parallel (the
# pipeline engine's (dp, pp) mesh: neighbouring stages on neighbouring GPUs) and tensor parallel innermost (the most
# traffic: the GPUs of one NVLink island). A knob's dimension not named here goes right after "dp".
DIMS = ("dp", "pp", "cp", "tp")
# the dimensions whose ranks compute on different tokens with the same weights: gradients are averaged and FSDP
# shards over them together (torchtitan's dp_shard_cp); "dp" ranks also read different sequences of the batch
GRADIENT_DIMS = ("dp", "cp")


def degrees(cfg: dict) -> dict[str, int]:
    """The parallel degrees above 1 a configuration sets (mesh dimension -> degree), from the knobs' `mesh_dim`,
    in mesh order. Values may be parsed or raw settings (a CLI string)."""
    from . import all_knobs
    out: dict[str, int] = {}
    for knob in all_knobs():
        if knob.runtime.mesh_dim and knob.name in cfg:
            value = cfg[knob.name]
            value = knob.parse(value) if isinstance(value, str) else value
            if int(value) > 1:
                out[knob.runtime.mesh_dim] = out.get(knob.runtime.mesh_dim, 1) * int(value)
    return dict(sorted(out.items(), key=lambda kv: _position(kv[0])))


def _position(dim: str) -> float:
    return DIMS.index(dim) if dim in DIMS else 0.5


def data_parallel_ranks(world: int, degrees: dict[str, int]) -> int:
    """Ranks that each hold a slice of the batch: the world over every other parallel degree (at least 1)."""
    return max(1, world // math.prod(d for k, d in degrees.items() if k != "dp"))


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of one trial's ranks: `world` ranks = dp x the other degrees, in DIMS order (row-major: the last
    dimension varies fastest over consecutive ranks)."""

    world: int
    degrees: dict[str, int] = field(default_factory=dict)  # the non-data dimensions above 1, outermost first
    _meshes: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        other = math.prod(self.degrees.values())
        if self.world % other:
            raise ValueError(f"parallel degrees {self.degrees} (x{other}) do not divide the {self.world} ranks")

    @classmethod
    def of(cls, plan: Plan, world: int) -> "ParallelDims":
        """The dimensions of a plan on `world` ranks."""
        mesh = {k: int(v) for k, v in plan.mesh.items() if k != "dp" and int(v) > 1}
        return cls(world=world, degrees=dict(sorted(mesh.items(), key=lambda kv: _position(kv[0]))))

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each reads its own sequences of the batch."""
        return self.world // math.prod(self.degrees.values())

    def degree(self, dim: str) -> int:
        """The degree of one dimension (1 where it is not used)."""
        return self.dp if dim == "dp" else self.degrees.get(dim, 1)

    @property
    def replicas(self) -> int:
        """Ranks that hold the same weights and average their gradients (data x context parallel): what DDP
        all-reduces and FSDP/ZeRO shard the model states over."""
        return math.prod(self.degree(d) for d in GRADIENT_DIMS)

    @property
    def names(self) -> tuple[str, ...]:
        return ("dp", *self.degrees)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dp, *self.degrees.values())

    def coords(self, rank: int) -> dict[str, int]:
        """A rank's index along every dimension."""
        out = {}
        for name, size in reversed(list(zip(self.names, self.shape))):
            out[name] = rank % size
            rank //= size
        return {n: out[n] for n in self.names}

    def data_rank(self, rank: int) -> int:
        """Which slice of the batch a rank reads (the ranks of one data-parallel replica read the same)."""
        return self.coords(rank)["dp"]

    @property
    def trivial(self) -> bool:
        """Only data parallel: the engines use the default process group, as without a mesh."""
        return not self.degrees

    def mesh(self, device_type: str):
        """The torch DeviceMesh over every dimension ("dp" first, even of size 1), built once."""
        if device_type not in self._meshes:
            from torch.distributed.device_mesh import init_device_mesh
            self._meshes[device_type] = init_device_mesh(device_type, self.shape, mesh_dim_names=self.names)
        return self._meshes[device_type]

    def submesh(self, device_type: str, *dims: str):
        """The mesh of some dimensions, flattened into one where there are several (FSDP over data x context);
        None where they span the whole world and the default group serves (nothing built)."""
        dims = tuple(d for d in dims if d in self.names)
        if math.prod(self.degree(d) for d in dims) == self.world:
            return None
        mesh = self.mesh(device_type)
        if len(dims) == 1:
            return mesh[dims[0]]
        return mesh[dims]._flatten("_".join(dims))

    def gradient_mesh(self, device_type: str):
        """The mesh DDP all-reduces and FSDP shards over (GRADIENT_DIMS); None: the whole world."""
        return self.submesh(device_type, *GRADIENT_DIMS)
