"""GPU kinds by exact identity, and each kind's datasheet figures.

A GPU name (what torch.cuda.get_device_name and nvidia-smi report, "NVIDIA H100 80GB HBM3", or what a user types,
"H100", "h100-sxm", "H100 PCIe") is read as its parts: the model ("H100"), the form factor (SXM, PCIe, NVL) and the
memory size ("80GB"); vendor words (NVIDIA, Tesla, GeForce) and the memory's type (HBM3) are left out. It is one kind
when exactly one row of KINDS takes those parts: a part a name leaves out is the row's marked default (an "H100" is
the SXM one), a part it gives must be the row's, and any word not understood makes it no kind. A different GPU
is never read as a known one by a shared substring (an H20 is not an H200, a PCIe H100 not an SXM one, a MIG slice
not its GPU).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuKind:
    """One GPU kind: the names that are it, and its datasheet figures (what a prediction for it assumes where it
    was never measured; a measured kind's records carry their own memory)."""
    name: str                   # the kind as trainscout prints it, e.g. "H100 PCIe"
    models: tuple[str, ...]     # the model words, lower case ("h100"; "rtx a6000" and "a6000")
    forms: tuple[str, ...]      # form factors a name may give: "sxm", "pcie", "nvl" (none: a name gives none)
    memory_gb: tuple[int, ...]  # memory sizes a name may give, in GB as written in names (80 in "80GB")
    bare_form: bool             # the kind a name without a form factor means
    bare_memory: bool           # the kind a name without a memory size means
    bf16_tflops: float          # dense bf16 tensor-core peak (without sparsity; V100: fp16, it has no bf16)
    memory_gib: float           # GPU memory as torch reports it
    hbm_tbps: float             # memory bandwidth, TB/s
    capability: str             # CUDA compute capability
    source: str                 # where the figures come from


KINDS: tuple[GpuKind, ...] = (
    GpuKind("H100", ("h100",), ("sxm",), (80,), True, True, 989.0, 79.1, 3.35, "9.0",
            "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: bf16 1,979 TFLOP/s with sparsity, 80 GB HBM3, "
            "3.35 TB/s"),
    GpuKind("H100 PCIe", ("h100",), ("pcie",), (80,), False, True, 756.0, 79.1, 2.0, "9.0",
            "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: bf16 1,513 TFLOP/s with sparsity, 80 GB HBM2e, "
            "2.0 TB/s; NVIDIA H100 PCIe product brief PB-11133-001: a 350 W card"),
    GpuKind("H100 NVL", ("h100",), ("nvl",), (94,), False, True, 835.0, 87.5, 3.9, "9.0",
            "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: bf16 1,671 TFLOP/s with sparsity, 94 GB HBM3, "
            "3.9 TB/s"),
    GpuKind("H200", ("h200",), ("sxm",), (141,), True, True, 989.0, 139.8, 4.8, "9.0",
            "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: bf16 1,979 TFLOP/s with sparsity, 141 GB HBM3e, "
            "4.8 TB/s"),
    GpuKind("H200 NVL", ("h200",), ("nvl",), (141,), False, True, 835.0, 139.8, 4.8, "9.0",
            "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL: bf16 1,671 TFLOP/s with sparsity, 141 GB HBM3e, "
            "4.8 TB/s"),
    GpuKind("GH200", ("gh200",), (), (96, 480), True, True, 989.0, 94.5, 4.0, "9.0",
            "NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 SXM's compute, 96 GB HBM3 at 4.0 TB/s (480 GB "
            "in its name counts the Grace CPU's LPDDR5X; the 144 GB HBM3e version is another kind)"),
    GpuKind("H20", ("h20",), (), (96,), True, True, 148.0, 94.5, 4.0, "9.0",
            "NVIDIA H20 product brief: bf16/fp16 148 dense TFLOP/s (fp8 296), 96 GB HBM3 (the GH200's 94.5 GiB as "
            "torch reports it), 4.0 TB/s; the 141 GB version is another kind"),
    GpuKind("H800", ("h800",), ("sxm",), (80,), True, True, 989.0, 79.1, 3.35, "9.0",
            "NVIDIA H800 SXM5: the H100 SXM's compute and memory, less NVLink bandwidth"),
    GpuKind("B200", ("b200",), (), (180, 192), True, True, 2250.0, 178.4, 8.0, "10.0",
            "NVIDIA DGX B200 / HGX B200 datasheet, per GPU: bf16 4.5 PFLOP/s with sparsity, 180-192 GB HBM3e, "
            "8 TB/s"),
    GpuKind("B100", ("b100",), (), (192,), True, True, 1750.0, 178.4, 8.0, "10.0",
            "NVIDIA HGX B100 datasheet, per GPU: bf16 3.5 PFLOP/s with sparsity, 192 GB HBM3e, 8 TB/s"),
    GpuKind("A100", ("a100",), ("sxm",), (80,), True, True, 312.0, 79.1, 2.0, "8.0",
            "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: bf16 312 TFLOP/s, 80 GB HBM2e, 2,039 GB/s"),
    GpuKind("A100 40GB", ("a100",), ("sxm",), (40,), True, False, 312.0, 39.4, 1.555, "8.0",
            "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM: bf16 312 TFLOP/s, 40 GB HBM2, 1,555 GB/s"),
    GpuKind("A100 PCIe", ("a100",), ("pcie",), (80,), False, True, 312.0, 79.1, 1.935, "8.0",
            "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB PCIe: bf16 312 TFLOP/s, 80 GB HBM2e, 1,935 GB/s"),
    GpuKind("A100 PCIe 40GB", ("a100",), ("pcie",), (40,), False, False, 312.0, 39.4, 1.555, "8.0",
            "NVIDIA A100 Tensor Core GPU datasheet, A100 40GB PCIe: bf16 312 TFLOP/s, 40 GB HBM2, 1,555 GB/s"),
    GpuKind("A800", ("a800",), ("sxm",), (80,), True, True, 312.0, 79.1, 2.0, "8.0",
            "NVIDIA A800 80GB SXM: the A100 80GB SXM's compute and memory, less NVLink bandwidth"),
    GpuKind("L40S", ("l40s",), ("pcie",), (48,), True, True, 362.0, 44.4, 0.864, "8.9",
            "NVIDIA L40S datasheet: bf16 733 TFLOP/s with sparsity, 48 GB GDDR6, 864 GB/s"),
    GpuKind("L40", ("l40",), ("pcie",), (48,), True, True, 181.0, 44.4, 0.864, "8.9",
            "NVIDIA L40 datasheet: bf16 362 TFLOP/s with sparsity, 48 GB GDDR6, 864 GB/s"),
    GpuKind("L4", ("l4",), ("pcie",), (24,), True, True, 121.0, 22.0, 0.3, "8.9",
            "NVIDIA L4 datasheet: bf16 242 TFLOP/s with sparsity, 24 GB GDDR6, 300 GB/s"),
    GpuKind("A10G", ("a10g",), (), (24,), True, True, 70.0, 22.0, 0.6, "8.6",
            "AWS EC2 G5 (NVIDIA A10G): 24 GB GDDR6, 600 GB/s; its bf16 peak as published for G5 instances"),
    GpuKind("A10", ("a10",), ("pcie",), (24,), True, True, 125.0, 22.0, 0.6, "8.6",
            "NVIDIA A10 datasheet: bf16 125 TFLOP/s (250 with sparsity), 24 GB GDDR6, 600 GB/s"),
    GpuKind("RTX 6000 Ada", ("rtx 6000 ada",), ("pcie",), (48,), True, True, 364.0, 47.5, 0.96, "8.9",
            "NVIDIA RTX 6000 Ada Generation datasheet: 48 GB GDDR6, 960 GB/s; Ada whitepaper: bf16 364 TFLOP/s"),
    GpuKind("A6000", ("a6000", "rtx a6000"), ("pcie",), (48,), True, True, 155.0, 47.5, 0.768, "8.6",
            "NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s; Ampere GA102 whitepaper: bf16 155 TFLOP/s"),
    GpuKind("RTX 4090", ("rtx 4090",), (), (24,), True, True, 165.0, 23.6, 1.0, "8.9",
            "NVIDIA Ada whitepaper, GeForce RTX 4090: bf16 165 TFLOP/s (fp32 accumulate), 24 GB GDDR6X, 1,008 GB/s"),
    GpuKind("RTX 3090", ("rtx 3090",), (), (24,), True, True, 71.0, 23.6, 0.94, "8.6",
            "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090: bf16 71 TFLOP/s, 24 GB GDDR6X, 936 GB/s"),
    GpuKind("V100", ("v100",), ("sxm",), (32,), True, True, 125.0, 31.7, 0.9, "7.0",
            "NVIDIA V100 datasheet, SXM2 32GB: fp16 125 TFLOP/s (no bf16), 900 GB/s"),
    GpuKind("V100 16GB", ("v100",), ("sxm",), (16,), True, False, 125.0, 15.8, 0.9, "7.0",
            "NVIDIA V100 datasheet, SXM2 16GB: fp16 125 TFLOP/s (no bf16), 900 GB/s"),
)

BY_NAME = {k.name: k for k in KINDS}

_VENDOR = {"nvidia", "tesla", "geforce"}
_FORMS = {"sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "pcie": "pcie", "nvl": "nvl"}
_MEMORY_TYPE = {"hbm2", "hbm2e", "hbm3", "hbm3e", "generation"}  # "RTX 6000 Ada Generation": not a model word
_SIZE = re.compile(r"(\d+)gb?")


def _parts(name: str) -> tuple[str, str | None, int | None] | None:
    """(model words, form factor, memory GB) of a GPU name; None where a part is given twice."""
    model, form, memory = [], None, None
    for word in re.sub(r"[-_/]", " ", name.lower()).split():
        size = _SIZE.fullmatch(word)
        if word in _VENDOR or word in _MEMORY_TYPE:
            continue
        if word in _FORMS:
            if form is not None:
                return None
            form = _FORMS[word]
        elif size:
            if memory is not None:
                return None
            memory = int(size.group(1))
        else:
            model.append(word)
    return " ".join(model), form, memory


def kind_of(name: str | None) -> GpuKind | None:
    """The one kind a GPU name is (see the module docstring); None for a name that is no kind here."""
    parts = _parts(name) if isinstance(name, str) else None
    if not parts or not parts[0]:
        return None
    model, form, memory = parts
    found = [k for k in KINDS if model in k.models
             and (k.bare_form if form is None else form in k.forms)
             and (k.bare_memory if memory is None else memory in k.memory_gb)]
    return found[0] if len(found) == 1 else None


def gpu_kind(name: str | None) -> str | None:
    """The kind's name of a GPU name ("NVIDIA H100 80GB HBM3" -> "H100"); None for a name that is no kind here."""
    kind = kind_of(name)
    return kind.name if kind else None


def gpu_facts(name: str | None) -> tuple[float, str] | None:
    """(memory GiB, capability) of a GPU name's kind; None for a name that is no kind here."""
    kind = kind_of(name)
    return (kind.memory_gib, kind.capability) if kind else None


def gpu_peak_tflops(name: str | None) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU name's kind; None for a name that is no kind here (MFU left null)."""
    kind = kind_of(name)
    return kind.bf16_tflops if kind else None


def known_kinds() -> str:
    """Every kind's name, for an error that lists them."""
    return ", ".join(k.name for k in KINDS)


def asked_kind(name: str, flag: str = "--gpu", measured: tuple[str, ...] = ()) -> str:
    """A GPU kind a user asked for by flag: a kind's name, or a measured GPU name that is no kind here given exactly
    (case aside: its measurements answer for it, nothing else's). ConfigError naming the flag and the known kinds
    for any other name."""
    from trainscout.spaces import ConfigError
    kind = gpu_kind(name)
    if kind:
        return kind
    exact = [m for m in measured if isinstance(m, str) and m.strip().lower() == name.strip().lower()]
    if exact:
        return exact[0]
    raise ConfigError(flag, f"{flag} {name}: not known as a GPU kind (a name is one kind exactly, with its "
                            f"form factor and memory where it has variants, e.g. 'H100', 'H100 PCIe', "
                            f"'NVIDIA H100 80GB HBM3'): give one of {known_kinds()}"
                            + (f", or a GPU measured there ({', '.join(sorted(set(measured)))})" if measured else ""))
