"""`trainscout verify --quality STEPS`: does a measured configuration whose knobs change the numerics train the same
model as its reference? Both train STEPS optimizer steps on real text (the corpus shipped in analysis/corpus/: six
public-domain books and Shakespeare, 1.16 M tokens of its own 8,192-token BPE), from the same seed (the same
initial weights) and the same sequence of batches, in trainscout's workers (the candidate's engine and every
transform, compile included).

What is compared, per seed, is the loss of each step: the candidate's minus the reference's over the last WINDOW
share of the steps, its mean relative to the reference's loss, with a 95 % interval (over seeds where there are two
or more; else over BLOCKS consecutive blocks of the window, as the steps are correlated). The verdict is VERIFIED
when the interval's upper end is within TOLERANCE (1 %) of the reference's loss, else FAILED. "Speed at equal loss"
is what the user pays for: the candidate's tokens/s over the reference's (their measurements in the store at the
recipe's batch when the store holds both, else these runs'), times the tokens the reference needs to reach the
candidate's final loss over the candidate's (from the curves smoothed over the window): a configuration 17 % faster
per step that needs 10 % more tokens to reach the same loss is 1.06x, not 1.17x.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os

from trainscout.spaces import ConfigError, micro_batch

from .table import measurement, ran_config, store_of

TOLERANCE = 0.01  # the candidate's loss may be at most 1 % above the reference's
WINDOW = 0.1      # the last tenth of the steps
BLOCKS = 5        # batch means of the window, for one seed
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


VOCAB = 8192  # the shipped tokenizer's


def corpus_text() -> str:
    """The shipped corpus (bench/build_corpus.py made it)."""
    with gzip.open(os.path.join(CORPUS, "books.txt.gz"), "rt", encoding="utf-8") as f:
        return f.read()


def train_tokenizer(text: str, vocab: int):
    """A byte-level BPE of `vocab` tokens trained on text (Hugging Face tokenizers; deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 100_000] for i in range(0, len(text), 100_000)], trainer)
    return tok


def corpus_tokens(folder: str, vocab: int = VOCAB) -> tuple[str, int]:
    """The shipped corpus as a flat uint16 file of token ids in folder (made once): (path, tokens). A model with
    fewer than 8,192 tokens in its vocabulary (the tests' tiny ones) gets a tokenizer of its size, trained here on
    the same text, so that every id is one of its tokens."""
    import numpy as np
    from tokenizers import Tokenizer
    if vocab < 257:
        raise ConfigError("--quality", f"the model's vocabulary of {vocab} tokens is smaller than the 256 bytes a "
                                       "byte-level tokenizer needs: verify --quality needs a vocabulary of >= 257")
    books, shipped = os.path.join(CORPUS, "books.txt.gz"), os.path.join(CORPUS, "tokenizer.json.gz")
    size = min(vocab, VOCAB)
    digest = hashlib.sha256(str(size).encode())
    for f in (books, shipped):
        with open(f, "rb") as fh:
            digest.update(fh.read())
    path = os.path.join(folder, f"quality-tokens-{digest.hexdigest()[:12]}.bin")
    if not os.path.exists(path):
        text = corpus_text()
        if size == VOCAB:
            with gzip.open(shipped, "rt", encoding="utf-8") as f:
                tok = Tokenizer.from_str(f.read())
        else:
            tok = train_tokenizer(text, size)
        os.makedirs(folder, exist_ok=True)
        np.asarray(tok.encode(text).ids, dtype=np.uint16).tofile(path + ".part")
        os.replace(path + ".part", path)  # never a half-written file under the final name
    return path, os.path.getsize(path) // 2


def verify_quality(source: str, *, key: str | None = None, steps: int = 500, seeds: int = 1,
                   global_batch: int | None = None, seq_len: int | None = None, timeout: float | None = None,
                   address: str | None = None, folder: str | None = None) -> dict:
    """Train the best (or the keyed) measurement and its reference for `steps` steps on the corpus; the comparison.
    Written to the folder as verify-quality-KEY.json and stored with the measurement (the search summary, results,
    the report and the export read it). global_batch / seq_len: the runs' batch (default: one micro-batch per data
    rank, the recipe's sequence length); the micro-batch is capped at what the batch gives each rank. folder: where
    the corpus' tokens and the JSON go (default: source where it is a folder)."""
    from trainscout.trial import quality
    from trainscout.trial.models import stored_model
    from trainscout.trial.runner import context
    store = store_of(source)
    rec = measurement(store, key, best=key is None)
    config, mb = ran_config(rec), micro_batch().name
    model = stored_model(rec.model, rec.model_config)
    ctx = context(model.config, rec.recipe["global_batch"], rec.world_size, rec.hardware or {"device": rec.device})
    changed = quality.changes(config, ctx)
    out = {"key": rec.key, "model": rec.model, "config": rec.config, "steps": steps, "seeds": seeds}
    if not changed:
        return out | {"verdict": quality.SAME, "why": "no knob of this configuration changes the numerics: it is its "
                                                      "own reference"}
    reference = quality.reference(config, changed)
    dp = rec.recipe["global_batch"] // (rec.grad_accum * config[mb])  # data-parallel ranks
    batch = global_batch or config[mb] * dp
    if batch % dp:
        raise ConfigError("--global-batch", f"--global-batch {batch} does not split over {dp} data-parallel ranks: "
                                            f"give a multiple of {dp}")
    mbs = min(config[mb], batch // dp)
    while (batch // dp) % mbs:
        mbs -= 1
    config[mb] = reference[mb] = mbs
    seq = seq_len or rec.recipe["seq_len"]
    keep = folder or (source if os.path.isdir(source) else None)  # where the JSON goes (none for a bare URL)
    folder = keep or os.path.abspath("quality")
    from trainscout.trial.models import sizes
    data, n_tokens = corpus_tokens(folder, sizes(model.config).vocab)
    runs = {"candidate": [], "reference": []}
    for seed in range(seeds):
        for role, settings in (("candidate", config), ("reference", reference)):
            r = _train(rec, model, settings, steps, seed, batch, seq, data, timeout, address)
            if not r.ok:
                return out | {"verdict": quality.FAILED, "why": f"the {role} run (seed {seed}) ended {r.status}: "
                                                                f"{r.error}", "status": str(r.status)}
            runs[role].append(r)
    out |= compare([r.m["losses"] for r in runs["candidate"]], [r.m["losses"] for r in runs["reference"]])
    out |= {"changes": changed, "reference": quality.differences(config, reference),
            "global_batch": batch, "seq_len": seq, mb: mbs, "tokens": steps * batch * seq,
            "corpus_tokens": n_tokens, "epochs": round(steps * batch * seq / n_tokens, 2),
            "speed": _speeds(store, rec, reference, runs), "status": "ok"}
    if out["token_efficiency"] is not None:
        out["speed_at_equal_loss"] = out["speed"]["ratio"] * out["token_efficiency"]
    if keep:
        with open(os.path.join(keep, f"verify-quality-{rec.key[:12]}.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    store.put_quality(rec.key, "verify", out)
    return out


def _train(rec, model, settings: dict, steps: int, seed: int, batch: int, seq: int, data: str, timeout, address):
    """One run of `steps` full optimizer steps on the corpus, from `seed` (no warm-up: every step is trained)."""
    from trainscout.trial import execute, prepare
    from trainscout.trial.models import overrides_of
    over = dict(overrides_of(rec.recipe), global_batch=batch, seq_len=seq)
    spec = prepare(model, settings, device=rec.device, workers=rec.world_size, steps=steps, warmup=0,
                   measure_accum=0, seed=seed, gate=False, **over)
    spec = spec.replace(data=data, data_dtype="uint16")
    return execute(spec, timeout=timeout or max(900.0, 60 * steps * (rec.metrics or {}).get("step_s", 1.0)),
                   address=address)


def compare(candidate: list[list[float]], reference: list[list[float]]) -> dict:
    """The loss comparison of paired runs (one list of per-step losses per seed, candidate and reference alike)."""
    n = min(len(x) for x in candidate + reference)
    w = max(2, math.ceil(WINDOW * n))
    rel_diffs = []  # per seed: the window's mean difference over the reference's mean loss
    for c, r in zip(candidate, reference):
        rel_diffs.append(sum(a - b for a, b in zip(c[n - w:n], r[n - w:n])) / sum(r[n - w:n]))
    mean_c = [sum(col) / len(col) for col in zip(*(c[:n] for c in candidate))]  # over seeds, per step
    mean_r = [sum(col) / len(col) for col in zip(*(r[:n] for r in reference))]
    if len(rel_diffs) >= 2:
        centre, half = _interval(rel_diffs)
    else:  # one seed: batch means of its window
        c, r = candidate[0][n - w:n], reference[0][n - w:n]
        size = max(1, w // BLOCKS)
        blocks = [sum(a - b for a, b in zip(c[i:i + size], r[i:i + size])) / sum(r[i:i + size])
                  for i in range(0, w - size + 1, size)]
        centre, half = _interval(blocks) if len(blocks) >= 2 else (rel_diffs[0], math.inf)
    final_c, final_r = sum(mean_c[n - w:]) / w, sum(mean_r[n - w:]) / w
    efficiency, reach = _token_efficiency(mean_c, mean_r, w)
    from trainscout.trial.quality import FAILED, INCONCLUSIVE, VERIFIED
    # verified: the whole interval within the tolerance; failed: the whole of it above; else it cannot tell
    verdict = VERIFIED if centre + half <= TOLERANCE else FAILED if centre - half > TOLERANCE else INCONCLUSIVE
    span = f"loss {centre:+.2%} (95 % interval {centre - half:+.2%} .. {centre + half:+.2%}) of the reference's over " \
           f"the last {w} steps"
    return {"verdict": verdict,
            "why": None if verdict == VERIFIED else f"{span}: above +{TOLERANCE:.0%}" if verdict == FAILED else
            f"{span}: straddles +{TOLERANCE:.0%}, too short or too noisy to tell (train longer or over more seeds)",
            "loss": {"candidate": final_c, "reference": final_r, "rel_diff": centre, "ci95": [centre - half,
                                                                                             centre + half]},
            "window": w, "token_efficiency": efficiency, "steps_to_equal_loss": reach,
            "curves": {"candidate": mean_c, "reference": mean_r}}


def _interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval."""
    from statistics import mean, stdev
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
    k = len(xs) - 1
    return mean(xs), t95.get(k, 1.96) * stdev(xs) / math.sqrt(len(xs))


def _smooth(xs: list[float], w: int) -> list[float]:
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x - (xs[i - w] if i >= w else 0.0)
        out.append(total / min(i + 1, w))
    return out


def _token_efficiency(cand: list[float], ref: list[float], w: int) -> tuple[float | None, int | None]:
    """Tokens the reference needs for the candidate's final loss over the candidate's own (> 1: the candidate learns
    more per token), and the step where the slower learner's smoothed curve reached the other's final loss."""
    n = len(cand)
    sc, sr = _smooth(cand, w), _smooth(ref, w)
    final_c, final_r = sc[-1], sr[-1]
    if final_c <= final_r:  # the candidate reaches the reference's final loss at some step <= n
        step = next((i + 1 for i, v in enumerate(sc) if v <= final_r), n)
        return n / step, step
    step = next((i + 1 for i, v in enumerate(sr) if v <= final_c), None)
    return (step / n, step) if step else (None, None)


def _speeds(store, rec, reference: dict, runs: dict) -> dict:
    """tokens/s of the candidate and the reference: their measurements in the store at the recipe's batch (the same
    model, ranks and GPU), else these runs' (one micro-batch per step); the ratio and where it comes from."""
    def same(r, settings):
        return (r.ok and r.model == rec.model and r.world_size == rec.world_size and r.recipe == rec.recipe
                and (r.hardware or {}).get("gpu") == (rec.hardware or {}).get("gpu")
                and all(r.config.get(k) == v for k, v in settings.items() if k != micro_batch().name))
    measured = [r for r in store.measurements() if same(r, reference)]
    if measured:
        ref_tok = max(r.measured.tokens_per_s for r in measured)
        tok = rec.measured.tokens_per_s
        return {"candidate_tokens_per_s": tok, "reference_tokens_per_s": ref_tok,
                "ratio": tok / ref_tok, "source": "the store's measurements at the recipe's batch"}
    c = sum(r.measured.tokens_per_s for r in runs["candidate"]) / len(runs["candidate"])
    r = sum(x.measured.tokens_per_s for x in runs["reference"]) / len(runs["reference"])
    return {"candidate_tokens_per_s": c, "reference_tokens_per_s": r, "ratio": c / r,
            "source": "these runs (median step; the store has no measurement of the reference)"}
