"""DeepSpeed ZeRO 1/2/3 with optional CPU offload; DeepSpeed's own mixed precision and accumulation."""
from __future__ import annotations

import os
import sys
import time

from trainscout.runtime import prepare_model

from .base import Engine, causal_lm_loss, optimizer, register_engine

DS_BUCKET = 5e8  # DeepSpeed's default reduce/allgather bucket, in elements
# torch's JIT-build lock (TORCH_EXTENSIONS_DIR/<op>/lock, torch.utils.file_baton.FileBaton) is held open by its builder
# from its creation to its removal: one that no process holds and this old was left by a builder that was killed (a
# trial's timeout, an OOM) and every later build of that op waits on it for good. The grace covers the instant between
# the builder closing it and removing it.
LOCK_GRACE_S = 5.0
STALE_LOCK_S = 300.0  # older than any build of an op takes: a lock not provably stale is named past this age
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "ceph", "beegfs", "glusterfs", "9p", "fuse")


class StaleBuildLock(RuntimeError):
    """A compiled extension's build lock that no process here holds, which this rank could not prove stale (a
    network filesystem, another host's builder may hold it; processes of its owner this rank cannot read)."""


def _locks(root: str | None) -> list[str]:
    import glob

    from torch.utils.cpp_extension import get_default_build_root
    if root:
        return glob.glob(os.path.join(root, "*", "lock"))
    base = get_default_build_root()  # torch adds a folder of its Python and CUDA versions under it
    return glob.glob(os.path.join(base, "*", "lock")) + glob.glob(os.path.join(base, "*", "*", "lock"))


def _held_by(uid: int) -> tuple[set[str], bool]:
    """(the files the processes of user uid on this host hold open, whether every one of them could be read)."""
    import glob
    held, whole = set(), True
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            if os.stat(proc).st_uid != uid:
                continue
            fds = os.listdir(os.path.join(proc, "fd"))
        except FileNotFoundError:  # the process ended meanwhile
            continue
        except OSError:
            whole = False
            continue
        for fd in fds:
            try:
                held.add(os.readlink(os.path.join(proc, "fd", fd)))
            except OSError:
                continue
    return held, whole


def _network_fs(path: str) -> str | None:
    """The type of the filesystem path is on where a builder on another host could hold its files, else None."""
    best, kind = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                _, mount, fstype, *_ = line.split()
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, fstype
    except OSError:
        return None
    return kind if kind and kind.split(".")[0] in NETWORK_FS else None


def clear_stale_build_locks(root: str | None = None, grace_s: float = LOCK_GRACE_S) -> list[str]:
    """Remove the build locks of compiled extensions (root: TORCH_EXTENSIONS_DIR, else torch's default folder) that are
    provably stale: at least grace_s old, on a local filesystem, held open by no process of their owner, every one of
    which could be read. Before DeepSpeed builds or loads its ops, so that none waits to its time limit on a lock a
    killed builder left. Returns the removed paths; StaleBuildLock (one line,
    naming the lock and the fix) for one no process holds that could not be proved stale and is older than a build
    takes. The ranks of one host take turns (an flock beside the locks): one removes, then builds under its own."""
    import fcntl
    locks = _locks(root)
    if not locks:
        return []
    removed: list[str] = []
    with open(os.path.join(os.path.dirname(os.path.dirname(locks[0])), ".trainscout-lock-check"), "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        for path in sorted({os.path.realpath(p) for p in _locks(root)}):
            for _ in range(2):  # a young lock no process holds: looked at again once it is grace_s old
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    break
                age = time.time() - st.st_mtime
                held, whole = _held_by(st.st_uid)
                if path in held:
                    break
                if age < grace_s:
                    time.sleep(grace_s - age)
                    continue
                fs = _network_fs(path)
                if whole and fs is None:
                    os.remove(path)
                    removed.append(path)
                elif age >= STALE_LOCK_S:
                    why = f"on a {fs} filesystem, where a builder on another host may hold it" if fs else \
                        "some processes of its owner could not be read"
                    raise StaleBuildLock(
                        f"a stale build lock of a compiled extension: {path} ({age / 60:.0f} min old; no process here "
                        f"holds it, {why}): DeepSpeed's build of that op would wait on it for good: remove it "
                        f"(rm {path}) once no build of it runs, and measure again")
                break
    return removed


def deepspeed_config(plan, recipe: dict, grad_accum: int) -> dict:
    """The DeepSpeed JSON config of a plan (also what `trainscout export --format deepspeed` writes): its
    engine_config is DeepSpeed's zero_optimization section."""
    zero = dict(plan.engine_config)
    cfg = {
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": recipe["grad_clip"],
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if plan.precision == "bf16-mixed":
        cfg["bf16"] = {"enabled": True}
    elif plan.precision == "fp16-mixed":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if "offload_optimizer" in zero:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": recipe["lr"], "betas": list(recipe["betas"]),
                                                        "weight_decay": recipe["weight_decay"]}}
    return cfg


# Host seconds of ZeRO-3's parameter hooks per micro-batch (its forward and backward): a fixed part and a part per
# module holding parameters, read off one H100 SXM box (16 host cores) at micro-batch 8, 2 micro-batches a step, where
# stage 3 is host-bound (bench/atlas_gaps_gpu.py part C): Pythia-160M (75 such modules) 0.196 s a micro-batch under
# stage 3 against 0.070 s under stage 0 (data/gpu-2026-12-06-s25/gaps_h100.log), Pythia-410M (147) 0.227 s against
# 0.153 (data/gpu-2026-12-06-s26/gaps_h100.log): 0.43 ms a module over a fixed 0.164 s. Per micro-batch, not per
# step: the H200 box's Pythia-410M ran 128 micro-batches a step at 0.249 s each. Pythia-1B (99 modules, 0.27 s of GPU
# work a micro-batch) ran 1.03x stage 0's time: its hooks hid behind the GPU. One host: another CPU runs them at its
# own speed.
ZERO3_HOOK_BASE_S, ZERO3_HOOK_S = 0.164, 4.3e-4


@register_engine
class DeepSpeedEngine(Engine):
    """DeepSpeed ZeRO: the model's transforms first, then deepspeed.initialize, then (compile) engine.compile()."""

    name = "deepspeed"
    launcher = "accelerate"
    portability = 2
    compute = "16-bit"  # DeepSpeed's bf16 / fp16 model: 16-bit weights, no autocast
    counts_micro_batches = True  # gradient_accumulation_steps: a step is that many micro_step calls
    formats = ("hf", "deepspeed", "accelerate", "command")

    def __init__(self, model, plan, recipe, device, world, measured_accum=1, dims=None):
        for path in clear_stale_build_locks(os.environ.get("TORCH_EXTENSIONS_DIR")):  # before DeepSpeed builds its ops
            print(f"trainscout: removed a stale build lock of a compiled extension (no process held it): {path}",
                  file=sys.stderr, flush=True)
        import deepspeed
        prepare_model(model, plan, dims=dims)
        self.config = deepspeed_config(plan, recipe, measured_accum)
        offload = self.offloaded(plan)[0]
        # the client optimizer passes every knob's optimizer hook; under offload DeepSpeed steps its own CPU Adam (the
        # config's "optimizer"), which the knobs that change the optimizer refuse
        client_opt = None if offload else optimizer([p for p in model.parameters() if p.requires_grad], plan, recipe,
                                                    device)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               optimizer=client_opt, config=self.config)
        prepare_model(self.engine, plan, after_sharding=True, dims=dims)

    def micro_step(self, batch, is_last: bool, scale: float):
        loss = causal_lm_loss(self.engine, batch)  # DeepSpeed divides by its accumulation count itself
        self.engine.backward(loss)
        if not is_last:
            self.engine.step()  # not a boundary: only advances DeepSpeed's micro-step counter
        return loss.detach() * scale  # scaled as the other engines' (Engine.micro_step)

    def optimizer_step(self):
        self.engine.step()

    def close(self):
        self.engine.destroy()  # its hooks and the optimizer's buffers (ZeRO-3's partitioned parameters)

    def optimizers(self):
        # ZeRO 1-3 and bf16 wrap a torch optimizer over the fp32 master partitions; without them it is the client's
        opt = self.engine.optimizer
        return [getattr(opt, "optimizer", opt)]

    def full_state_dict(self, names, rank):
        # the fp32 master weights, not the module's 16-bit copies: DeepSpeed's safe_get_full_fp32_param assembles
        # each from its partitions (a collective under ZeRO 1-3: every rank calls it, in the same order); None where
        # the parameter has no master copy (fp32 without ZeRO), which trains the module's own
        from deepspeed.utils import safe_get_full_fp32_param
        ds = self.engine
        full = {name: safe_get_full_fp32_param(p) for name, p in ds.module.named_parameters(remove_duplicate=False)}
        if ds.zero_optimization_stage() == 3:  # the buffers and any parameter without a master (gathered in 16-bit)
            sd = ds._zero3_consolidated_16bit_state_dict()
        else:
            sd = ds.module.state_dict()
        if rank != 0:
            return {}
        return {k: (full[k] if full.get(k) is not None else v) for k, v in sd.items()}

    @classmethod
    def model_states(cls, c, plan, N, D, mixed):
        # 16-bit weights (stage 3: a shard + the live gathered layers) and gradients (stages 2-3: a shard), fp32
        # master weights and AdamW states sharded unless offloaded to the CPU, and the reduce bucket
        zero = plan.engine_config
        stage, w = zero.get("stage", 0), 2 if mixed else 4
        live = min(N, float(zero.get("stage3_max_live_parameters", 1e9)))
        return {"weights": 0 if "offload_param" in zero else (w * N / D + w * live * (D > 1) if stage == 3 else w * N),
                "gradients": w * N / D if stage >= 2 else w * N,
                "optimizer": 0 if "offload_optimizer" in zero else (4 * mixed + 8) * N / D,
                "buffers": w * min(N, DS_BUCKET) + (w * min(N, 5e7) if stage == 3 else 0)}

    @classmethod
    def hook_s(cls, plan):
        # stage 3 fetches each module's parameters before its forward and backward and releases them after, in
        # DeepSpeed's Python hooks, on one GPU as on many
        return (ZERO3_HOOK_BASE_S, ZERO3_HOOK_S) if plan.engine_config.get("stage") == 3 else (0.0, 0.0)

    @classmethod
    def offloaded(cls, plan):
        return "offload_optimizer" in plan.engine_config, "offload_param" in plan.engine_config

    @classmethod
    def files(cls, rec):
        # no train_batch_size: DeepSpeed (and HF, accelerate) derive it from micro-batch x accumulation x the world
        # size of the launch, so the file runs on any GPU count (a fixed one fails DeepSpeed's assertion elsewhere)
        return {"deepspeed.json": deepspeed_config(rec.plan, rec.recipe, rec.grad_accum)}

    @classmethod
    def hf_args(cls, rec, paths):
        # the config inline (TrainingArguments takes the dict): a path, relative to the export folder, failed a stock
        # TrainingArguments(**json) run from any other folder; deepspeed.json beside it holds the same for the others
        return {"deepspeed": cls.files(rec)["deepspeed.json"]}

    @classmethod
    def accelerate(cls, rec, paths):
        return {"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"deepspeed_config_file": paths["deepspeed.json"],
                                     "zero3_init_flag": rec.plan.engine_config.get("stage") == 3}}
