"""What a search may try: the knob space less what a space file or --set fixes or narrows.

A space file is YAML (loaded with safe_load) mapping knob names to a value (fixed) or a list (searched over
those values only), e.g.

    precision: bf16-mixed        # fixed
    zero_stage: [0, 1, 2]        # searched over these
    micro_batch_size: [4, 8, 16]

Knobs it does not name are searched over their whole domain, when their requirements hold.
"""
from __future__ import annotations

import json
import os

import yaml

from trainscout.spaces import ConfigError, Context, all_knobs, applies, fmt, get, resolve

MAX_SPACE_BYTES = 1 << 20
CACHED = 100_000  # allowed-value sets a Space keeps (one per knob and the values drawn before it)


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
    """Fixed knobs and narrowed domains over the registered knobs; samples with Optuna define-by-run, valid by
    construction where it knows its context (Space.build): a knob is offered only the values its declared rules allow
    beside the values already drawn (see `sample`)."""

    def __init__(self, fixed: dict, domains: dict, ctx: Context | None = None):
        self.fixed = fixed        # knob -> parsed value
        self.domains = domains    # knob -> tuple of parsed values
        self.ctx = ctx            # what the rules are checked against (None: every domain value offered)
        self._allowed: dict[str, tuple[tuple, dict]] = {}  # (knob, values before it) -> (allowed, why not the rest)
        self._why: dict[tuple, str] = {}  # (knob, value) -> why the last walk did not offer it

    def __getstate__(self):  # the cache of allowed values stays in the process that built it
        return dict(self.__dict__, _allowed={}, _why={})

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
        return cls(fixed, cls._feasible(ctx, fixed, domains), ctx)

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
                raise ConfigError(k.name, f"{k.name}: none of "
                                          f"{'|'.join(fmt(v) for v in domains.get(k.name, k.choices))} can run here "
                                          "with the fixed knobs: fix it with --set or widen its list")
            out[k.name] = tuple(keep)
        return out

    def sample(self, trial) -> dict:
        """Define-by-run: a knob is sampled only when its requirements hold (otherwise it keeps its default), and
        only over the values its rules allow beside those drawn before it (`allowed`, in all_knobs() order: each
        value checked by spaces.resolve with the knobs not yet drawn at their defaults, so the last draw is a valid
        configuration). A knob whose allowed values are fewer than its domain is suggested under a name that
        carries them (param_name): an Optuna distribution keeps its choices under one name."""
        return self._walk(lambda name, choices: trial.suggest_categorical(name, list(choices)))[0]

    def params_of(self, point: dict) -> dict:
        """The Optuna parameters (param_name -> value) that make `sample` return `point`'s values: what a start
        point is enqueued as (point_of says when it is refused)."""
        return self.point_of(point)[1]

    def point_of(self, point: dict) -> tuple[dict, dict]:
        """(the configuration `sample` returns for point's values, its Optuna parameters). ConfigError (the rule's
        reason) where point holds a value the rules refuse beside the values drawn before it, or lacks one that a
        knob it applies to needs."""
        def given(name: str, choices: tuple):
            knob = name.split("|", 1)[0]
            if knob not in point:
                raise ConfigError(knob, f"{knob}: the point has no value for it")
            if point[knob] not in choices:
                raise self._refused(knob, point[knob])
            return point[knob]
        cfg, params = self._walk(given)
        for knob, value in point.items():  # a value the rules left no choice for
            if knob in self.domains and cfg.get(knob) != value and applies(get(knob), cfg):
                raise self._refused(knob, value)
        return cfg, params

    def _refused(self, knob: str, value) -> ConfigError:
        return ConfigError(knob, self.refused_why(knob, value) or f"{knob}={fmt(value)} is not in the space's domain")

    def _walk(self, choose) -> tuple[dict, dict]:
        """(configuration, the parameters chosen by name): choose(param name, allowed values) picks each searched
        knob's value."""
        cfg: dict = {}
        params: dict = {}
        self._why = {}
        for k in all_knobs():
            if k.name in self.fixed:
                cfg[k.name] = self.fixed[k.name]
            elif not applies(k, cfg):
                cfg[k.name] = k.default
            else:
                choices = tuple(self.domains.get(k.name, k.choices))
                allowed = self.allowed(k.name, choices, cfg) if len(choices) > 1 else choices
                if len(allowed) == 1:
                    cfg[k.name] = allowed[0]
                    continue
                name = param_name(k.name, allowed, choices)
                cfg[k.name] = params[name] = choose(name, allowed)
        return cfg, params

    def allowed(self, name: str, choices: tuple, cfg: dict) -> tuple:
        """The values of knob `name` that the rules allow beside cfg (the values drawn before it; the knobs after it
        at their defaults): all of `choices` without a context, or where the rules allow none of them (the draw is
        then refused as invalid, with the rule's reason)."""
        if self.ctx is None:
            return choices
        key = json.dumps([name, cfg], sort_keys=True, default=str)
        if key not in self._allowed:
            if len(self._allowed) > CACHED:
                self._allowed.clear()
            ok, why = [], {}
            for v in choices:
                try:
                    resolve({**cfg, name: v}, self.ctx)
                    self._ahead(name, {**cfg, name: v})
                    ok.append(v)
                except ConfigError as e:
                    why[fmt(v)] = str(e)
            self._allowed[key] = (tuple(ok) or choices, why)
        got, why = self._allowed[key]
        self._why.update({(name, v): w for v, w in why.items()})
        return got

    def _ahead(self, name: str, cfg: dict) -> None:
        """ConfigError where a knob drawn after `name` whose domain leaves its default out would have no value the
        rules allow beside cfg (its default, which the check above assumed, is not one it can be drawn at)."""
        later = False
        for k in all_knobs():
            later = later or k.name == name
            dom = self.domains.get(k.name, ())
            if not later or k.name == name or k.name in cfg or len(dom) < 2 or k.default in dom or not applies(k, cfg):
                continue
            errors = []
            for u in dom:
                try:
                    resolve({**cfg, k.name: u}, self.ctx)
                    break
                except ConfigError as e:
                    errors.append(e)
            else:
                raise errors[0]

    def refused_why(self, name: str, value) -> str | None:
        """Why the last walk did not offer knob `name` the value (the rule's error), None where it did."""
        return self._why.get((name, fmt(value)))

    def describe(self) -> dict:
        return {"fixed": {k: fmt(v) for k, v in self.fixed.items()},
                "searched": {k: [fmt(v) for v in vs] for k, vs in self.domains.items()}}


def param_name(knob: str, allowed: tuple, choices: tuple) -> str:
    """The Optuna parameter a knob is drawn under: its name where every value of its domain is allowed, else its
    name with the allowed values (`optimizer_state|fp32,bf16`), whose choices stay the same whatever else is drawn."""
    return knob if tuple(allowed) == tuple(choices) else f"{knob}|{','.join(fmt(v) for v in allowed)}"


def knob_params(params: dict) -> dict:
    """Optuna parameters by knob name (a conditional parameter's name less its allowed values)."""
    return {name.split("|", 1)[0]: v for name, v in params.items()}


def _scalar(name: str, value):
    if isinstance(value, (dict, list)) or (value is not None and not isinstance(value, (str, int, float, bool))):
        raise ConfigError(name, f"{name}: {type(value).__name__} is not a knob value: give a value or a list of values")
    if value is None:
        raise ConfigError(name, f"{name}: no value given: give a value or a list of values")
    return value
