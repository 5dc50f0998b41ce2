"""`trainscout atlas`: the whole atlas as one self-contained HTML page (no network: data, CSS and JS inline).

It answers "what does this GPU train, how fast, for how much": a table of the best configuration per model, GPU
kind and count (tokens/s, MFU, days and rent of the recipe), a plot of tokens/s against model size, and every row
(paged, sortable, each with its provenance), all under one set of filters: model size, architecture, GPU kind, GPU
count, knob, measured / predicted / out of memory, origin, text. The rows travel as columns with a string table,
small enough for the browser to filter them at once (docs/atlas.md).
"""
from __future__ import annotations

import html
import json
import os

from trainscout.trial.gpus import gpu_kind
from trainscout.trial.mfu import CONVENTION
from trainscout.trial.records import TOKENS_PER_S

from .families import describe, plan_of
from .samples import row_id, row_mfu

COLUMNS = ("model", "params_m", "arch", "gpu", "gpus", "status", TOKENS_PER_S, "mfu", "peak_gib", "run_tokens_b",
           "days", "rent_usd", "global_batch", "describe", "tags", "labels", "origin", "date", "command", "source",
           "key", "verified")
ORIGINS = {"trainscout": "shipped", "contributed": "contributed", "local": "local store"}
STRINGS = {"model", "arch", "gpu", "status", "describe", "origin", "date", "command", "source", "key", "verified"}


def _tags(config: dict, defaults: dict) -> list[str]:
    """The knobs a configuration sets away from their defaults, as `--set` writes them; a knob that only applies
    under another's value (Knob.requires: a pipeline's schedule) shown where it applies, its default included; the
    micro-batch's knob never (the page has the micro-batch in its description)."""
    from trainscout.spaces import all_knobs, applies, fmt
    knobs = {k.name: k for k in all_knobs() if not k.search.micro_batch}

    def shown(name, v) -> bool:
        k = knobs[name]
        if not applies(k, config):
            return False
        under = any(config.get(r, knobs[r].default) != knobs[r].default for r in k.requires if r in knobs)
        return v != defaults[name] or under  # set, or applying only because another knob is set

    return [f"{name}={fmt(v)}" for name, v in sorted(config.items()) if name in knobs and shown(name, v)]


def page_rows(atlas) -> list[dict]:
    """One page row per measurement (ok or out of memory) and per shipped prediction."""
    from trainscout.analysis.cost import load_prices, price_for
    from trainscout.spaces import all_knobs
    defaults = {k.name: k.default for k in all_knobs()}
    prices = load_prices()
    feats = atlas.model.get("features", {})
    params = {}  # a model's parameter count, from the features of any of its rows
    for r in atlas.rows:
        f = feats.get(row_id(r))
        if f:
            params[r["record"]["model"]] = f["n_params"]
    out = []
    for r in atlas.rows:
        rec, prov = r["record"], r["provenance"]
        m, recipe, plan = rec.get("metrics") or {}, rec.get("recipe") or {}, plan_of(rec)
        ok = rec.get("status") == "ok"
        n = rec.get("world_size") or 1
        days = recipe["total_steps"] * m["step_s"] / 86400 if ok and m.get("step_s") else None
        p = price_for(prov.get("gpu"), prices)
        n_params = params.get(rec["model"]) or m.get("n_params")
        out.append({
            "model": rec["model"], "params_m": round(n_params / 1e6, 1) if n_params else None,
            "arch": (rec.get("model_config") or {}).get("model_type") or "unknown",
            "gpu": gpu_kind(prov.get("gpu")) or prov.get("gpu"), "gpus": n,
            "status": "measured" if ok else "out of memory",
            TOKENS_PER_S: round(m[TOKENS_PER_S]) if ok else None,
            "mfu": round(row_mfu(r) or 0, 4) or None if ok else None,
            "peak_gib": round(m["peak_memory_gib"], 1) if ok and m.get("peak_memory_gib") else None,
            "days": round(days, 2) if days else None,
            "run_tokens_b": round(recipe["total_steps"] * recipe["global_batch"] * recipe["seq_len"] / 1e9, 1),
            "rent_usd": round(p.rent_usd(days, n)) if p and days else None,
            "global_batch": recipe.get("global_batch"), "describe": describe(rec["config"], plan),
            "tags": _tags(rec["config"], defaults), "labels": [lb["name"] for lb in r.get("labels") or []],
            "origin": ORIGINS.get(prov.get("origin"), prov.get("origin")), "date": str(prov.get("date"))[:10],
            "command": prov.get("command"), "source": prov.get("source"), "key": r["key"],
            "verified": ", ".join(f"{v['steps']} full steps ({v['runner']}): {v['ratio']:.3f} x the projection"
                                  for v in r.get("verified") or []) or None,
            "label_why": "; ".join(f"{lb['name']}: {lb['why']}" for lb in r.get("labels") or []) or None})
    for name, got in sorted(atlas.model.get("predictions", {}).items()):
        for row in got["rows"][:3]:
            p = price_for(got["gpu"], prices)
            out.append({
                "model": got["model"], "params_m": round(got["n_params"] / 1e6, 1), "arch": "gpt_neox",
                "gpu": got["gpu"], "gpus": row["gpus"], "status": "predicted",
                TOKENS_PER_S: round(row[TOKENS_PER_S]), "mfu": round(row["mfu"], 4) if row.get("mfu") else None,
                "peak_gib": round(row["peak_memory_gib"], 1), "days": round(row["projected_days"], 2),
                "run_tokens_b": round(row["total_steps"] * row["tokens_per_step"] / 1e9, 1),
                "rent_usd": round(p.rent_usd(row["projected_days"], row["gpus"])) if p else None,
                "global_batch": row["global_batch"], "describe": row["describe"],
                "tags": _tags(row["config"], defaults), "labels": [], "origin": "shipped prediction",
                "date": "", "command": f"trainscout search --model {got['model']} --time-budget 30m",
                "source": f"calibrated on {', '.join(row['calibrated_on'])} (level {row['level']})", "key": "",
                "verified": None, "label_why": None})
    return out


def encode(rows: list[dict]) -> dict:
    """Rows as columns, strings through one table (a large atlas repeats its commands and sources)."""
    table: dict[str, int] = {}

    def s(v):
        if v is None:
            return -1
        if v not in table:
            table[v] = len(table)
        return table[v]
    cols = {}
    for c in COLUMNS:
        if c in STRINGS:
            cols[c] = [s(r[c]) for r in rows]
        elif c in ("tags", "labels"):
            cols[c] = [[s(t) for t in r[c]] for r in rows]
        else:
            cols[c] = [r[c] for r in rows]
    return {"strings": list(table), "n": len(rows), "cols": cols}


def build_html(atlas, title: str = "trainscout atlas") -> str:
    """The page's HTML: the encoded rows inline, with the script and styles that filter and draw them."""
    rows = page_rows(atlas)
    data = json.dumps(encode(rows), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    layers = ", ".join(f"{html.escape(layer.name)} ({len(layer.rows)} rows"
                       + (f", {len(layer.refused)} refused" if layer.refused else "") + ")" for layer in atlas.layers)
    loo = atlas.model.get("loo_summary", {}).get("model", {}).get("all", {})
    tps, mem = loo.get(TOKENS_PER_S, {}), loo.get("peak_memory", {})
    err = (f"Predicted rows: leave-one-model-out over the shipped rows, tokens/s median "
           f"{100 * tps['median_abs']:.1f} % (worst {100 * tps['worst']:+.0f} %), peak memory median "
           f"{100 * mem['median_abs']:.1f} % (worst {100 * mem['worst']:+.0f} %).") if tps.get("n") else ""
    return (TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__LAYERS__", layers)
            .replace("__ERR__", html.escape(err)).replace("__MFU__", html.escape(CONVENTION))
            .replace("__TOKENS_PER_S__", TOKENS_PER_S).replace("__DATA__", data))


def write(atlas, out_dir: str, name: str = "atlas.html") -> str:
    """Write the page into out_dir; its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(build_html(atlas))
    return path


TEMPLATE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:14px 22px}
header h1{margin:0;font-size:20px;font-weight:600}
header p{margin:4px 0 0;color:#c8d3de;font-size:12.5px}
main{padding:14px 22px;display:grid;grid-template-columns:250px 1fr;gap:18px}
aside{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:12px;align-self:start;position:sticky;top:10px}
aside h3{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:#5b6776;margin:12px 0 4px}
aside h3:first-child{margin-top:0}
aside label{display:block;font-size:13px;cursor:pointer;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
aside select,aside input[type=text]{width:100%;box-sizing:border-box;font:inherit;padding:3px}
.count{color:#7a8594;font-size:11.5px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:12px 14px;margin-bottom:16px;min-width:0}
section h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{padding:4px 6px;border-bottom:1px solid #edf0f3;text-align:left;vertical-align:top}
th{background:#f0f3f6;cursor:pointer;user-select:none;white-space:nowrap;position:sticky;top:0}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.nw{white-space:nowrap}
tr.predicted td{color:#6b4b00;background:#fffaf0}
tr.oom td{color:#8a1c1c}
.badge{display:inline-block;padding:0 5px;border-radius:3px;font-size:11px;font-weight:600;white-space:nowrap;margin:1px 0}
.b-measured{background:#dff3e4;color:#17612e}.b-predicted{background:#fdebc8;color:#7a5200}
.b-oom{background:#fbe0e0;color:#8a1c1c}.b-label{background:#e8e4f8;color:#4a3a8c}.b-contrib{background:#dceafb;color:#1d4f8c}
#plot{width:100%;height:300px;display:block}
.pager{margin-top:8px;display:flex;gap:8px;align-items:center;font-size:12.5px}
.pager button{font:inherit;padding:2px 10px}
.detail td{background:#f8fafc;font-size:12px;color:#37414d}
.muted{color:#7a8594}.legend span{margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:50%;margin-right:4px;vertical-align:middle}
</style></head><body>
<header><h1>__TITLE__: what a GPU trains, how fast, for how much</h1>
<p>Layers: __LAYERS__. MFU recounted: __MFU__; days and rent for each row's recipe (rent: list-price estimates,
analysis/prices.json). __ERR__</p></header>
<main>
<aside id="filters">
<h3>Model size (parameters)</h3>
<select id="fmin"></select><select id="fmax" style="margin-top:4px"></select>
<h3>Architecture</h3><div id="farch"></div>
<h3>GPU kind</h3><div id="fgpu"></div>
<h3>GPU count</h3><div id="fgpus"></div>
<h3>Row</h3><div id="fstatus"></div>
<h3>Origin</h3><div id="forigin"></div>
<h3>Knob</h3><select id="fknob"><option value="">any configuration</option></select>
<h3>Text</h3><input type="text" id="ftext" placeholder="model, configuration, command">
<p class="count" id="fcount"></p>
</aside>
<div style="min-width:0">
<section><h2>Best per model, GPU kind and count</h2><div id="best"></div></section>
<section><h2>Tokens/s against model size</h2>
<div class="legend" id="legend"></div><canvas id="plot"></canvas></section>
<section><h2>Every row</h2><div id="rows"></div>
<div class="pager"><button id="prev">&larr;</button><span id="page"></span><button id="next">&rarr;</button></div></section>
</div></main>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const S = D.strings, C = D.cols, N = D.n;
const str = (c, i) => { const v = C[c][i]; return v < 0 ? null : S[v]; };
const esc = s => String(s == null ? "" : s).replace(/[&<>"]/g, ch => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[ch]));
const fmt = (v, d) => v == null ? "" : Number(v).toLocaleString("en-US", {maximumFractionDigits: d || 0, minimumFractionDigits: d || 0});
const SIZES = [0, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000, 1e9];
const SIZE_TEXT = v => v >= 1e9 ? "any" : v >= 1000 ? (v / 1000) + " B" : v + " M";
function fill(sel, vals, pick) {
  sel.innerHTML = vals.map((v, i) => `<option value="${v}"${i === pick ? " selected" : ""}>${SIZE_TEXT(v)}</option>`).join("");
}
fill(document.getElementById("fmin"), SIZES.slice(0, -1), 0);
fill(document.getElementById("fmax"), SIZES.slice(1), SIZES.length - 2);
document.getElementById("fmin").options[0].text = "from any";
document.getElementById("fmax").options[SIZES.length - 2].text = "to any";
const STATUS_NAME = {"measured": "measured", "predicted": "predicted", "out of memory": "out of memory"};
function checks(id, col, numeric) {
  const counts = new Map();
  for (let i = 0; i < N; i++) { const v = numeric ? C[col][i] : str(col, i); counts.set(v, (counts.get(v) || 0) + 1); }
  const vals = [...counts.keys()].sort((a, b) => numeric ? a - b : String(a).localeCompare(String(b)));
  document.getElementById(id).innerHTML = vals.map(v =>
    `<label><input type="checkbox" checked data-v="${esc(v)}"> ${esc(numeric ? v + " GPU" + (v > 1 ? "s" : "") : v)} <span class="count">${counts.get(v)}</span></label>`).join("");
}
checks("farch", "arch"); checks("fgpu", "gpu"); checks("fgpus", "gpus", true); checks("fstatus", "status"); checks("forigin", "origin");
const tagCount = new Map();
for (let i = 0; i < N; i++) for (const t of C.tags[i]) tagCount.set(t, (tagCount.get(t) || 0) + 1);
const knobSel = document.getElementById("fknob");
for (const t of [...tagCount.keys()].sort((a, b) => S[a].localeCompare(S[b])))
  knobSel.insertAdjacentHTML("beforeend", `<option value="${t}">${esc(S[t])} (${tagCount.get(t)})</option>`);
function checked(id, numeric) {
  const set = new Set();
  for (const el of document.querySelectorAll(`#${id} input:checked`)) set.add(numeric ? Number(el.dataset.v) : el.dataset.v);
  return set;
}
let sortCol = "__TOKENS_PER_S__", sortDir = -1, page = 0, filtered = [], open = -1;
const PAGE = 100, BEST = 150;
function filter() {
  const t0 = performance.now();
  const lo = Number(document.getElementById("fmin").value), hi = Number(document.getElementById("fmax").value);
  const arch = checked("farch"), gpu = checked("fgpu"), gpus = checked("fgpus", true), st = checked("fstatus"), org = checked("forigin");
  const knob = knobSel.value === "" ? -1 : Number(knobSel.value);
  const text = document.getElementById("ftext").value.trim().toLowerCase();
  const out = [];
  for (let i = 0; i < N; i++) {
    const p = C.params_m[i];
    if (p != null && (p < lo || p > hi)) continue;
    if (!arch.has(str("arch", i)) || !gpu.has(str("gpu", i)) || !gpus.has(C.gpus[i]) || !st.has(str("status", i)) || !org.has(str("origin", i))) continue;
    if (knob >= 0 && C.tags[i].indexOf(knob) < 0) continue;
    if (text && !((str("model", i) + " " + str("describe", i) + " " + (str("command", i) || "")).toLowerCase().includes(text))) continue;
    out.push(i);
  }
  filtered = out;
  sortRows();
  page = 0; open = -1;
  render();
  const ms = performance.now() - t0;
  document.getElementById("fcount").textContent = `${out.length.toLocaleString()} of ${N.toLocaleString()} rows, filtered and drawn in ${ms.toFixed(1)} ms`;
  return ms;
}
function sortRows() {
  const c = C[sortCol], isStr = STRINGS.has(sortCol);
  filtered.sort((a, b) => {
    let x = isStr ? str(sortCol, a) : c[a], y = isStr ? str(sortCol, b) : c[b];
    if (x == null && y == null) return a - b;
    if (x == null) return 1; if (y == null) return -1;
    return (x < y ? -1 : x > y ? 1 : a - b) * sortDir;
  });
}
const STRINGS = new Set(["model", "arch", "gpu", "status", "describe", "origin", "date", "command", "source", "key", "verified", "label_why"]);
function badge(i) {
  const s = str("status", i);
  let b = `<span class="badge b-${s === "out of memory" ? "oom" : s}">${s}</span>`;
  if (str("origin", i) === "contributed") b += ` <span class="badge b-contrib">contributed</span>`;
  return b;
}
function config(i) {  // the configuration, with the labels of a method known to bias its number
  let h = esc(str("describe", i));
  for (const l of C.labels[i]) h += ` <span class="badge b-label" title="a method known to bias this number: see the row's details">${esc(S[l])}</span>`;
  return h;
}
function renderBest() {
  const best = new Map();
  for (const i of filtered) {
    if (C.tokens_per_s[i] == null) continue;
    const k = str("model", i) + "|" + str("gpu", i) + "|" + C.gpus[i] + "|" + C.global_batch[i];
    const j = best.get(k);
    if (j === undefined || (str("status", j) === "predicted" && str("status", i) === "measured") ||
        (str("status", j) === str("status", i) && C.tokens_per_s[i] > C.tokens_per_s[j])) best.set(k, i);
  }
  const all = [...best.values()].sort((a, b) => (C.params_m[a] || 0) - (C.params_m[b] || 0) || C.gpus[a] - C.gpus[b]);
  const rows = all.slice(0, BEST);
  let h = `<table><thead><tr><th>model</th><th class="n">params</th><th>GPU</th><th></th><th class="n">batch</th><th class="n">tokens/s</th><th class="n">MFU</th><th class="n">peak GiB</th><th class="n">run tokens</th><th class="n">days</th><th class="n">rent</th><th>best configuration</th></tr></thead><tbody>`;
  for (const i of rows) {
    const s = str("status", i);
    h += `<tr class="${s === "predicted" ? "predicted" : ""}"><td class="nw">${esc(str("model", i))}</td><td class="n">${C.params_m[i] == null ? "" : fmt(C.params_m[i]) + " M"}</td><td class="nw">${C.gpus[i]} &times; ${esc(str("gpu", i))}</td><td>${badge(i)}</td><td class="n">${fmt(C.global_batch[i])}</td><td class="n">${fmt(C.tokens_per_s[i])}</td><td class="n">${fmt(C.mfu[i], 3)}</td><td class="n">${fmt(C.peak_gib[i], 1)}</td><td class="n">${C.run_tokens_b[i] == null ? "" : fmt(C.run_tokens_b[i], 1) + " B"}</td><td class="n">${fmt(C.days[i], 1)}</td><td class="n">${C.rent_usd[i] == null ? "" : "$" + fmt(C.rent_usd[i])}</td><td>${config(i)}</td></tr>`;
  }
  const more = all.length > BEST ? `<p class="muted">${(all.length - BEST).toLocaleString()} more models and GPUs: narrow the filters (model size, text).</p>` : "";
  document.getElementById("best").innerHTML = rows.length ? h + "</tbody></table>" + more : `<p class="muted">No row matches the filters.</p>`;
}
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];
function renderPlot() {
  const cv = document.getElementById("plot"), r = window.devicePixelRatio || 1;
  const w = cv.clientWidth, h = cv.clientHeight;
  cv.width = w * r; cv.height = h * r;
  const g = cv.getContext("2d"); g.scale(r, r); g.clearRect(0, 0, w, h);
  const pts = filtered.filter(i => C.tokens_per_s[i] != null && C.params_m[i] != null);
  const gpus = [...new Set(pts.map(i => str("gpu", i) + " x" + C.gpus[i]))].sort();
  document.getElementById("legend").innerHTML = gpus.map((k, j) => `<span><i style="background:${COLORS[j % COLORS.length]}"></i>${esc(k.replace(" x", " × "))}</span>`).join("")
    + `<span><i style="background:#fff;border:2px solid #555"></i>hollow: predicted</span>`;
  if (!pts.length) return;
  const L = 56, B = 34, T = 22, R = 10;
  const lx = pts.map(i => Math.log10(C.params_m[i])), ly = pts.map(i => Math.log10(C.tokens_per_s[i]));
  const x0 = Math.floor(Math.min(...lx)), x1 = Math.ceil(Math.max(...lx)) + (Math.min(...lx) === Math.max(...lx) ? 1 : 0);
  const y0 = Math.floor(Math.min(...ly)), y1 = Math.ceil(Math.max(...ly)) + (Math.min(...ly) === Math.max(...ly) ? 1 : 0);
  const X = v => L + (v - x0) / (x1 - x0) * (w - L - R), Y = v => h - B - (v - y0) / (y1 - y0) * (h - B - T);
  g.strokeStyle = "#e3e7ec"; g.fillStyle = "#5b6776"; g.font = "11px system-ui"; g.lineWidth = 1;
  for (let e = x0; e <= x1; e++) {
    g.beginPath(); g.moveTo(X(e), T); g.lineTo(X(e), h - B); g.stroke();
    const t = SIZE_TEXT(Math.pow(10, e)), tw = g.measureText(t).width;
    g.fillText(t, Math.min(Math.max(X(e) - tw / 2, 0), w - tw - 1), h - B + 14);
  }
  for (let e = y0; e <= y1; e++) { g.beginPath(); g.moveTo(L, Y(e)); g.lineTo(w - R, Y(e)); g.stroke(); g.fillText(Number(Math.pow(10, e)).toLocaleString("en-US"), 2, Y(e) + 4); }
  g.fillText("parameters", w / 2 - 24, h - 4); g.fillText("tokens/s", 2, 12);
  const paths = new Map();  // one path per colour and kind: 10,000 points cost a few fills, not 10,000
  pts.forEach((i, j) => {
    const k = (gpus.indexOf(str("gpu", i) + " x" + C.gpus[i]) % COLORS.length) + (str("status", i) === "predicted" ? "p" : "m");
    if (!paths.has(k)) paths.set(k, new Path2D());
    const path = paths.get(k), x = X(lx[j]), y = Y(ly[j]);
    path.moveTo(x + 3.2, y); path.arc(x, y, 3.2, 0, 6.2832);
  });
  for (const [k, path] of paths) {
    const c = COLORS[parseInt(k)];
    if (k.endsWith("p")) { g.strokeStyle = c; g.lineWidth = 2; g.stroke(path); }
    else { g.fillStyle = c; g.globalAlpha = .75; g.fill(path); g.globalAlpha = 1; }
  }
}
const HEAD = [["model", "model"], ["params_m", "params"], ["gpu", "GPU"], ["status", ""], ["__TOKENS_PER_S__", "tokens/s"], ["mfu", "MFU"], ["peak_gib", "peak GiB"], ["days", "days"], ["rent_usd", "rent"], ["global_batch", "batch"], ["describe", "configuration"], ["date", "date"]];
const NUMERIC = new Set(["params_m", "__TOKENS_PER_S__", "mfu", "peak_gib", "days", "rent_usd", "global_batch"]);
function renderRows() {
  const pages = Math.max(1, Math.ceil(filtered.length / PAGE));
  page = Math.min(page, pages - 1);
  let h = `<table><thead><tr>` + HEAD.map(([c, t]) => `<th data-c="${c}" class="${NUMERIC.has(c) ? "n" : ""}">${t}${c === sortCol ? (sortDir < 0 ? " &darr;" : " &uarr;") : ""}</th>`).join("") + `</tr></thead><tbody>`;
  for (const i of filtered.slice(page * PAGE, page * PAGE + PAGE)) {
    const s = str("status", i);
    h += `<tr data-i="${i}" class="${s === "predicted" ? "predicted" : s === "out of memory" ? "oom" : ""}" style="cursor:pointer"><td class="nw">${esc(str("model", i))}</td><td class="n">${C.params_m[i] == null ? "" : fmt(C.params_m[i]) + " M"}</td><td class="nw">${C.gpus[i]} &times; ${esc(str("gpu", i))}</td><td>${badge(i)}</td><td class="n">${fmt(C.tokens_per_s[i])}</td><td class="n">${fmt(C.mfu[i], 3)}</td><td class="n">${fmt(C.peak_gib[i], 1)}</td><td class="n">${fmt(C.days[i], 1)}</td><td class="n">${C.rent_usd[i] == null ? "" : "$" + fmt(C.rent_usd[i])}</td><td class="n">${fmt(C.global_batch[i])}</td><td>${config(i)}</td><td class="nw">${esc(str("date", i))}</td></tr>`;
    if (i === open) h += `<tr class="detail"><td colspan="12"><b>command</b> ${esc(str("command", i))}<br><b>source</b> ${esc(str("source", i))} &middot; <b>origin</b> ${esc(str("origin", i))}${str("key", i) ? " &middot; <b>key</b> " + esc(str("key", i)) : ""}${str("verified", i) ? "<br><b>verified</b> " + esc(str("verified", i)) : ""}${str("label_why", i) ? "<br><b>label</b> " + esc(str("label_why", i)) : ""}<br><b>knobs</b> ${C.tags[i].map(t => esc(S[t])).join(", ") || "defaults"}</td></tr>`;
  }
  document.getElementById("rows").innerHTML = h + "</tbody></table>";
  document.getElementById("page").textContent = `page ${page + 1} of ${pages} (${PAGE} rows a page)`;
}
function render() { renderBest(); renderPlot(); renderRows(); }
document.getElementById("filters").addEventListener("input", filter);
document.getElementById("rows").addEventListener("click", e => {
  const th = e.target.closest("th");
  if (th) { const c = th.dataset.c; if (c === sortCol) sortDir = -sortDir; else { sortCol = c; sortDir = NUMERIC.has(c) ? -1 : 1; } sortRows(); renderRows(); return; }
  const tr = e.target.closest("tr[data-i]");
  if (tr) { const i = Number(tr.dataset.i); open = open === i ? -1 : i; renderRows(); }
});
document.getElementById("prev").onclick = () => { page = Math.max(0, page - 1); renderRows(); };
document.getElementById("next").onclick = () => { page++; renderRows(); };
window.addEventListener("resize", renderPlot);
// a link can carry a filter: atlas.html#text=fp8, #knob=fp8=tensorwise
for (const part of location.hash.slice(1).split("&")) {
  const [k, ...v] = part.split("="), val = decodeURIComponent(v.join("="));
  if (k === "text") document.getElementById("ftext").value = val;
  if (k === "knob") for (const o of knobSel.options) if (o.value !== "" && S[Number(o.value)] === val) knobSel.value = o.value;
}
filter();
if (location.hash === "#bench") {  // headless timing: each filter once, the times in the page (docs/BENCHMARKS.md)
  const times = [];
  const set = (id, v) => { const el = document.getElementById(id); el.value = v; times.push(filter()); };
  set("fmin", 100); set("fmax", 10000); set("ftext", "fp8"); set("ftext", "");
  knobSel.selectedIndex = Math.min(1, knobSel.options.length - 1); times.push(filter());
  knobSel.selectedIndex = 0;
  const box = document.querySelector("#fgpus input"); if (box) { box.checked = false; times.push(filter()); box.checked = true; }
  const st = document.querySelector("#fstatus input"); if (st) { st.checked = false; times.push(filter()); st.checked = true; }
  set("fmin", 0); set("fmax", 1e9);
  const out = document.createElement("pre"); out.id = "bench";
  out.textContent = "filter ms: " + times.map(t => t.toFixed(1)).join(" ") + " max " + Math.max(...times).toFixed(1);
  document.body.appendChild(out);
}
</script></body></html>
"""  # noqa: E501 - the page's HTML, CSS and script as the browser gets them
