"""What a projected run costs: rented GPU-hours, or the purchase price of the box it needs.

The cost model of "$100K or 100 Days" (Khandelwal et al., 2024): a measured configuration projects the days of
the full run on its GPUs; renting costs days x 24 x $/GPU-hour x GPUs, buying costs the GPUs plus the rest of
the machines that hold them. Prices are list-price estimates (analysis/prices.json, each with its source and
date); `--prices FILE.json` overrides any of them, checked whole before use.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainscout.spaces import ConfigError
from trainscout.trial.records import TOKENS_PER_S
from trainscout.trial.status import Status

if TYPE_CHECKING:
    import pandas as pd

BUILTIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prices.json")
NUMBERS = ("gpu_usd", "machine_usd", "rent_usd_per_gpu_hour")
FIELDS = ("kind", "match", *NUMBERS, "gpus_per_machine", "source")
CPU = "CPU"  # the hardware name of a CPU run (a prices file may price it with "match": "^CPU$")


@dataclass(frozen=True)
class Price:
    """One GPU's list prices: to buy (the GPU, a whole machine of them) and to rent (per GPU-hour), with the source."""

    name: str
    match: str | None             # a GPU that is no kind (trial/gpus.py): a case-insensitive regular expression
    gpu_usd: float                # purchase price of one GPU
    gpus_per_machine: int
    machine_usd: float            # purchase price of one whole machine, its GPUs included
    rent_usd_per_gpu_hour: float
    source: str
    kinds: tuple[str, ...] = ()   # the GPU kinds it prices, by exact identity (trial.gpus.gpu_kind)

    @property
    def host_usd(self) -> float:
        """A machine less its GPUs: chassis, CPUs, memory, network."""
        return max(0.0, self.machine_usd - self.gpus_per_machine * self.gpu_usd)

    def machines(self, gpus: int) -> int:
        """Machines needed to hold `gpus` GPUs (at least one)."""
        return max(1, math.ceil(gpus / self.gpus_per_machine))

    def box_usd(self, gpus: int) -> float:
        """Buying what a run on `gpus` GPUs needs: the GPUs and the machines that hold them."""
        return gpus * self.gpu_usd + self.machines(gpus) * self.host_usd

    def rent_usd(self, days: float, gpus: int) -> float:
        """Renting `gpus` of these GPUs for `days` (the module's rent_usd)."""
        return rent_usd(days, gpus, self)


def rent_usd(days: float, gpus: int, price: Price) -> float:
    """Renting the run: projected days x 24 h x $/GPU-hour x GPUs."""
    return days * 24.0 * price.rent_usd_per_gpu_hour * gpus


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ConfigError("--prices", f"--prices {path}: cannot read it ({e.strerror}): give a readable JSON file")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError("--prices", f"--prices {path} is not JSON ({str(e).splitlines()[0][:120]}): "
                                      "write it like analysis/prices.json")


def _checked(path: str, name: str, entry, known: dict | None) -> dict:
    """One entry of a prices file: known field names, numbers >= 0, a whole number of GPUs, a valid pattern."""
    where = f"--prices {path}: gpus.{name}"
    if not isinstance(entry, dict):
        raise ConfigError("--prices", f"{where} is not an object: write e.g. {{\"rent_usd_per_gpu_hour\": 2.5}}")
    for field in entry:
        if field not in FIELDS:
            raise ConfigError("--prices", f"{where}.{field} is not a price field: use {', '.join(FIELDS)}")
    if known is None:
        missing = [f for f in FIELDS if f not in entry and f not in ("source", "kind", "match")]
        if "kind" not in entry and "match" not in entry:
            missing.append("kind (or match)")
        if missing:
            raise ConfigError("--prices", f"{where}: unknown GPU (known: {', '.join(_builtin_names())}): fix the "
                                          f"name, or define a new one with {', '.join(missing)}")
    for field in NUMBERS:
        if field in entry:
            v = entry[field]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError("--prices", f"{where}.{field} is {v!r}: give a number of US dollars >= 0")
            if v < 0:
                raise ConfigError("--prices", f"{where}.{field} is {v} (negative): give a price >= 0")
    if "gpus_per_machine" in entry:
        v = entry["gpus_per_machine"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError("--prices", f"{where}.gpus_per_machine is {v!r}: give a whole number >= 1")
    if "kind" in entry:
        from trainscout.trial.gpus import BY_NAME, known_kinds
        given = entry["kind"] if isinstance(entry["kind"], list) else [entry["kind"]]
        bad = next((k for k in given if not isinstance(k, str) or k not in BY_NAME), None) if given else "[]"
        if bad is not None:
            raise ConfigError("--prices", f"{where}.kind {bad!r} is not a GPU kind: give one of {known_kinds()} "
                                          "(or a list of them)")
    if "match" in entry:
        try:
            re.compile(entry["match"]) if isinstance(entry["match"], str) and entry["match"] else None
        except re.error as e:
            raise ConfigError("--prices", f"{where}.match {entry['match']!r} is not a regular expression ({e}): "
                                          "give a pattern of the GPU name, e.g. \"H100\"")
        if not isinstance(entry["match"], str) or not entry["match"]:
            raise ConfigError("--prices", f"{where}.match must be a non-empty pattern of the GPU name, e.g. \"H100\"")
    if "source" in entry and not isinstance(entry["source"], str):
        raise ConfigError("--prices", f"{where}.source must be text: say where the numbers come from")
    return entry


def _gpus_of(path: str, data) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        raise ConfigError("--prices", f"--prices {path} must be an object with \"gpus\": {{NAME: {{field: value}}}} "
                                      "(see analysis/prices.json)")
    extra = [k for k in data if k not in ("gpus", "note")]
    if extra:
        raise ConfigError("--prices", f"--prices {path}: top-level key {extra[0]!r} is not known: use \"gpus\" "
                                      "(and \"note\")")
    return data["gpus"]


def _builtin_names() -> list[str]:
    return list(_gpus_of(BUILTIN, _read(BUILTIN)))


def load_prices(path: str | None = None) -> list[Price]:
    """The built-in estimates, with a prices file's entries over them; in matching order (a GPU the file adds
    comes first, so that a more specific pattern wins)."""
    base = _gpus_of(BUILTIN, _read(BUILTIN))
    merged = {name: dict(entry) for name, entry in base.items()}
    added: dict[str, dict] = {}
    if path:
        for name, entry in _gpus_of(path, _read(path)).items():
            entry = _checked(path, str(name), entry, base.get(name))
            if name in merged:
                merged[name].update(entry)
                if "source" not in entry:
                    merged[name]["source"] = f"{os.path.basename(path)} (over: {base[name]['source']})"
            else:
                added[name] = dict(entry, source=entry.get("source", os.path.basename(path)))
    out = []
    for name, e in {**added, **merged}.items():
        kinds = e.get("kind") or ()
        out.append(Price(name=name, match=e.get("match"), gpu_usd=float(e["gpu_usd"]),
                         gpus_per_machine=int(e["gpus_per_machine"]), machine_usd=float(e["machine_usd"]),
                         rent_usd_per_gpu_hour=float(e["rent_usd_per_gpu_hour"]), source=e["source"],
                         kinds=(kinds,) if isinstance(kinds, str) else tuple(kinds)))
    return out


def price_for(hardware: str | None, prices: list[Price]) -> Price | None:
    """The first entry for the hardware name: for a GPU of a known kind (trial.gpus.gpu_kind, exact identity) one
    naming that kind, or whose `match` is the kind's name whole; for any other name (a GPU that is no kind there,
    'CPU') one whose `match` is found in it. None: no price (an H20 is not priced as an H200, nor a GH200)."""
    if not hardware:
        return None
    from trainscout.trial.gpus import gpu_kind
    kind = gpu_kind(hardware)
    for p in prices:
        if kind is not None:
            if kind in p.kinds or (p.match and re.fullmatch(p.match, kind, flags=re.IGNORECASE)):
                return p
        elif p.match and re.search(p.match, hardware, flags=re.IGNORECASE):
            return p
    return None


def hardware_name(row) -> str | None:
    """What a row ran on: the GPU name torch reported, 'CPU' for a CPU run, None when nothing ran."""
    gpu = row.get("gpu")
    if isinstance(gpu, str) and gpu:
        return gpu
    return CPU if row.get("device") == "cpu" else None


def with_costs(df: pd.DataFrame, prices: list[Price]) -> pd.DataFrame:
    """The results table plus hardware, price entry, rental cost of the projected run and purchase cost of its box."""
    import pandas as pd  # here, not at import: `trainscout lookup` prices rows without pandas (0.7 s to import)
    df = df.copy()
    hw, names, rent, box = [], [], [], []
    for row in df.to_dict("records"):
        h = hardware_name(row)
        p = price_for(h, prices)
        days, n = row.get("projected_days"), row.get("world_size")
        ok = p is not None and days is not None and not pd.isna(days) and n is not None and not pd.isna(n)
        hw.append(h)
        names.append(p.name if p else None)
        rent.append(p.rent_usd(float(days), int(n)) if ok else None)
        box.append(p.box_usd(int(n)) if p is not None and n is not None and not pd.isna(n) else None)
    df["hardware"], df["price"] = hw, names
    df["rent_usd"] = pd.array(rent, dtype="Float64").astype(float)
    df["box_usd"] = pd.array(box, dtype="Float64").astype(float)
    return df


def compare_hardware(df: pd.DataFrame, prices: list[Price]) -> pd.DataFrame:
    """The hardware measured in a store side by side: one row per model x hardware x world size, with its
    fastest configuration's tokens/s, MFU, projected days, rental cost, and the purchase cost of the box."""
    import pandas as pd
    cols = ["model", "hardware", "world_size", "trials", "ok", TOKENS_PER_S, "mfu", "peak_memory_gib",
            "projected_days", "rent_usd", "box_usd", "price", "key"]
    df = with_costs(df, prices)
    df = df[df["hardware"].notna() & df["model"].notna()]
    rows = []
    for (model, hw, n), g in df.groupby(["model", "hardware", "world_size"], sort=False, dropna=True):
        ok = g[(g["status"] == Status.OK) & g[TOKENS_PER_S].notna()]
        best = ok.loc[ok[TOKENS_PER_S].idxmax()] if len(ok) else None
        p = price_for(hw, prices)
        rows.append({"model": model, "hardware": hw, "world_size": int(n), "trials": len(g), "ok": len(ok),
                     TOKENS_PER_S: best[TOKENS_PER_S] if best is not None else None,
                     "mfu": best["mfu"] if best is not None else None,
                     "peak_memory_gib": best["peak_memory_gib"] if best is not None else None,
                     "projected_days": best["projected_days"] if best is not None else None,
                     "rent_usd": best["rent_usd"] if best is not None else None,
                     "box_usd": p.box_usd(int(n)) if p else None, "price": p.name if p else None,
                     "key": best["key"] if best is not None else None})
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["model", "projected_days"], na_position="last").reset_index(drop=True)
