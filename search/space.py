"""What a search may try: the knob space less what a space file or --set fixes or narrows.

A space file is YAML (loaded with safe_load) mapping knob names to a value (fixed) or a list (searched over
those values only), e.g.

    precision: bf16-mixed        # fixed
    zero_stage: [0, 1, 2]        # searched over these
    micro_batch_size: [4, 8, 16]

Knobs it does not name are searched over their whole domain, when their requirements hold.
"""
from __future__ import annotations

import os

import yaml

from trainscout.spaces import ConfigError, Context, all_knobs, fmt, get, resolve

MAX_SPACE_BYTES = 1 << 20


def load_space_file(path: str) -> dict:
    """The raw mapping of a space file; ConfigError (naming --space) for anything else."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise ConfigError("--space", f"cannot read {path}: {e.strerror}: give a readable YAML file")
    if size > MAX_SPACE_BYTES:
        raise ConfigError("--space", f"{path} is {size:,} bytes: a space file is at most {MAX_SPACE_BYTES:,} bytes")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except UnicodeDecodeError:
        raise ConfigError("--space", f"{path} is not UTF-8 text: give a YAML file")
    except OSError as e:  # a directory, a file that vanished, no permission
        raise ConfigError("--space", f"cannot read {path}: {e.strerror}: give a readable YAML file")
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError("--space", f"{path} is not valid YAML{at} ({problem}): fix the file")
    except RecursionError:
        raise ConfigError("--space", f"{path} nests too deeply: a space file maps knob names to a value or a list")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("--space", f"{path} must map knob names to a value or a list (got {type(data).__name__})")
    return data


class Space:
    """Fixed knobs and narrowed domains over the registered knobs; samples with Optuna define-by-run."""

    def __init__(self, fixed: dict, domains: dict):
        self.fixed = fixed        # knob -> parsed value
        self.domains = domains    # knob -> tuple of parsed values

    @classmethod
    def build(cls, raw: dict, sets: dict, ctx: Context) -> "Space":
        fixed, domains = {}, {}
        for name, value in {**raw, **sets}.items():
            if not isinstance(name, str):
                raise ConfigError("--space", f"key {name!r} is not a knob name: run `trainscout knobs`")
            knob = get(name)
            if isinstance(value, list):
                if not value:
                    raise ConfigError(name, f"{name}: the list of values is empty: give at least one value")
                vals = tuple(knob.parse(_scalar(name, v)) for v in value)
                if len(set(map(fmt, vals))) != len(vals):
                    raise ConfigError(name, f"{name}: a value is listed twice: list each once")
                if len(vals) == 1:
                    fixed[name] = vals[0]
                else:
                    domains[name] = vals
            else:
                fixed[name] = knob.parse(_scalar(name, value))
        resolve(fixed, ctx)  # the fixed knobs must be valid together before anything is searched around them
        return cls(fixed, cls._feasible(ctx, fixed, domains))

    @staticmethod
    def _feasible(ctx: Context, fixed: dict, domains: dict) -> dict:
        """Each searched knob's domain less the values this box, model and recipe can never run (fp16 on a CPU,
        a micro-batch that does not divide the per-rank batch, ...): fixed for the whole study, as Optuna needs."""
        out = {}
        for k in all_knobs():
            if k.name in fixed:
                continue
            keep = []
            for v in domains.get(k.name, k.choices):
                trial = {**fixed, **{o: a[-1] for o, a in k.requires.items() if o not in fixed}, k.name: v}
                try:
                    resolve(trial, ctx)
                    keep.append(v)
                except ConfigError:
                    pass
            if not keep and k.name not in domains:  # e.g. pipeline knobs on one rank: left at the default
                keep = [k.default]
            if not keep:
                raise ConfigError(k.name, f"{k.name}: none of {'|'.join(fmt(v) for v in domains.get(k.name, k.choices))} "
                                          "can run here with the fixed knobs: fix it with --set or widen its list")
            out[k.name] = tuple(keep)
        return out

    def sample(self, trial) -> dict:
        """Define-by-run: a knob is sampled only when its requirements hold; otherwise it keeps its default."""
        cfg: dict = {}
        for k in all_knobs():
            if k.name in self.fixed:
                cfg[k.name] = self.fixed[k.name]
            elif not k.applies(cfg):
                cfg[k.name] = k.default
            else:
                choices = self.domains.get(k.name, k.choices)
                cfg[k.name] = trial.suggest_categorical(k.name, list(choices)) if len(choices) > 1 else choices[0]
        return cfg

    def describe(self) -> dict:
        return {"fixed": {k: fmt(v) for k, v in self.fixed.items()},
                "searched": {k: [fmt(v) for v in vs] for k, vs in self.domains.items()}}


def _scalar(name: str, value):
    if isinstance(value, (dict, list)) or (value is not None and not isinstance(value, (str, int, float, bool))):
        raise ConfigError(name, f"{name}: {type(value).__name__} is not a knob value: give a value or a list of values")
    if value is None:
        raise ConfigError(name, f"{name}: no value given: give a value or a list of values")
    return value
