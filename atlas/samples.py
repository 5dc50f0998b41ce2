"""A measured row as the predictions read it: a Sample, with the features computed once per row (the roofline step and
the memory model's terms, the model built on the meta device; shipped in atlas/model.json)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from trainscout.spaces.plan import Plan
from trainscout.trial.gpus import gpu_kind  # a GPU kind from a GPU's name
from trainscout.trial.quality import FAILED

from .families import arch_family, families, plan_of, settings

HOST_BOUND = 0.8  # of a measured step that the host's floor (steptime.host_s) takes, for Sample.host_bound


@dataclass
class Sample:
    """One ok measurement with the model terms it is predicted from."""

    id: str
    key: str
    model: str
    shape: str          # the model's identity: the same shape, the same model (a name or a config file)
    arch: str
    n_params: float
    family: str         # dense | MoE (arch_family)
    gpu: str | None     # its GPU kind
    world: int
    fam: tuple          # family() at every level
    config: dict        # its knob settings
    plan: Plan
    roofline_s: float   # steptime.step_s
    step_s: float       # measured (projected full step)
    tokens_per_step: int
    states: float
    acts: float
    peak: float | None  # measured peak bytes (the fullest rank), None where not recorded
    mfu: float | None   # recomputed (trainscout.trial.mfu), from the row's derived values
    host_s: float = 0.0  # steptime.host_s: the host work a step cannot be shorter than (ZeRO-3's hooks)
    gate_failed: bool = False  # its quality gate failed: a speed still, never a configuration to recommend

    @functools.cached_property
    def knobs(self) -> dict:
        """Its knobs' values as they act (families.settings)."""
        return settings(self.config, self.plan)

    @functools.cached_property
    def micro(self):
        """The micro-batch it ran (the knob that declares micro_batch, as measured: a probe's settled one)."""
        from trainscout.spaces import all_knobs
        k = next(k for k in all_knobs() if k.search.micro_batch)
        return k.search.measured(self.config.get(k.name, k.default), self.plan)

    @property
    def ratio(self) -> float:
        return self.step_s / self.roofline_s

    @property
    def host_bound(self) -> bool:
        """Its measured step is mostly the host's floor (HOST_BOUND of it or more): its ratio tells nothing of the
        GPU's speed, so it calibrates no other row (calibrate.py)."""
        return self.host_s >= HOST_BOUND * self.step_s

    def predicted_s(self, ratio: float) -> float:
        """Its step at a calibrated ratio: the roofline's GPU time times it, never under the host's floor."""
        return max(self.roofline_s * ratio, self.host_s)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s


def row_mfu(row: dict) -> float | None:
    """A row's MFU: the recomputed one it carries (derived), else recomputed here (trainscout.trial.mfu: a store
    layer's record carries none)."""
    got = (row.get("derived") or {}).get("mfu")
    if got is not None:
        return got
    from trainscout.trial.mfu import mfu
    from trainscout.trial.records import Record
    try:
        return mfu(Record.from_dict({k: v for k, v in row["record"].items() if k not in ("key", "source")}))
    except Exception:  # noqa: BLE001 - a model this trainscout cannot count: MFU unknown
        return None


def row_id(row: dict) -> str:
    """A row's identity in model.json: its key and its trial."""
    return f"{row['key']}:{row['record'].get('trial_id')}"


SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "tie_word_embeddings", "rotary_pct", "use_parallel_residual",
              "head_dim", "num_local_experts", "num_experts", "num_experts_per_tok")


def shape_of(model_config: dict | None) -> str:
    """The model's identity across names: the sizes that make it (a config.json of the same shape is the model)."""
    import json
    c = model_config or {}
    return json.dumps({k: c.get(k) for k in SHAPE_KEYS if c.get(k) is not None}, sort_keys=True)


def features(record) -> dict:
    """What the predictions read of a measured row, computed once (the model on the meta device): the roofline
    step, the memory model's two terms, the parameter count."""
    from trainscout.predictor import memory, steptime
    from trainscout.trial.models import sizes
    spec = memory.with_config(record)
    states, acts = memory.terms(spec)
    return {"roofline_s": steptime.step_s(spec), "host_s": steptime.host_s(spec), "states": states, "acts": acts,
            "n_params": memory.counts(spec.model_config)["N"], "layers": sizes(spec.model_config).layers,
            "arch": spec.model_config.get("model_type"), "family": arch_family(spec.model_config)}


def samples(rows: list[dict], feats: dict[str, dict]) -> list[Sample]:
    """The ok rows that have features, as Samples."""
    out = []
    for row in rows:
        rec, f = row["record"], feats.get(row_id(row))
        m = rec.get("metrics") or {}
        if rec.get("status") != "ok" or not f or not m.get("step_s"):
            continue
        peaks = m.get("peak_allocated_mib")
        plan, world = plan_of(rec), rec.get("world_size") or 1
        out.append(Sample(
            id=row_id(row), key=row["key"], model=rec["model"], shape=shape_of(rec.get("model_config")) or rec["model"],
            arch=f["arch"], n_params=f["n_params"], gpu=gpu_kind(row["provenance"].get("gpu")), world=world,
            family=f.get("family") or arch_family(rec.get("model_config")),
            fam=families(rec["config"], plan, world, f.get("family") or arch_family(rec.get("model_config"))),
            config=rec["config"], plan=plan,
            roofline_s=f["roofline_s"], step_s=m["step_s"],
            tokens_per_step=rec["recipe"]["global_batch"] * rec["recipe"]["seq_len"],
            states=f["states"], acts=f["acts"], peak=max(peaks) * 2**20 if peaks else None,
            mfu=row_mfu(row), host_s=f.get("host_s", 0.0),
            gate_failed=(m.get("quality") or {}).get("gate") == FAILED))
    return out
