"""P6: does a self-paired LoRA tandem rollout fit in the memory of a solo one?

The senior is a peft LoRA model (r = 16 on q/k/v/o); the junior is the *same* module with the adapter
disabled (``tandem_rlvr.models.AdapterOff``), so no second copy of the weights exists. Each side runs
in a fresh subprocess (peak RSS is a process-wide high-water mark): build the model, warm up, record
the resident set, run one rollout, record ``getrusage`` max RSS.

- ``solo``: ``generate(lora, None, schedule none)``;
- ``tandem``: ``generate(lora, AdapterOff(lora), word p=0.5)``, lockstep (two KV caches);
- ``copy`` (for contrast): the junior a frozen deep copy of the base weights instead.

Ratio = peak RSS tandem ÷ solo (target ≤ 1.2). Also reported: the same ratio for memory above the
bare interpreter (imports done, no model), where the weights are ~all of it.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import common as C

BIG = C.Size(512, 12, heads=8, kv_heads=2)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(side: str, batch: int, tokens: int) -> dict:
    from peft import LoraConfig, get_peft_model

    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.models import AdapterOff, freeze
    from tandem_rlvr.engines.rollout import generate
    from tandem_rlvr.engines.types import Sampling

    tok = C.tokenizer()
    ids, mask = C.prompts(tok, batch)
    gc.collect()
    rss_bare = _rss_mb()
    base = C.model(len(tok), BIG, 0)
    n_params = C.n_params(base)
    junior_copy = freeze(copy.deepcopy(base)) if side == "copy" else None
    lora = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                           lora_dropout=0.0, task_type="CAUSAL_LM")).eval()
    junior = {"solo": None, "tandem": AdapterOff(lora), "copy": junior_copy}[side]
    schedule = make_schedule("none") if side == "solo" else make_schedule("word", tok, p=0.5)
    kw = {"eos_token_ids": C.NO_EOS, "pad_token_id": tok.pad_token_id, "seed": 0, "record_junior": False}
    generate(lora, junior, ids[:1], mask[:1], schedule, Sampling(max_new_tokens=4), **kw)  # warm-up
    gc.collect()
    rss_model = _rss_mb()
    peak_before = _peak_mb()
    t0 = time.perf_counter()
    r = generate(lora, junior, ids, mask, schedule, Sampling(max_new_tokens=tokens, temperature=0.6), **kw)
    dt = time.perf_counter() - t0
    assert int(r.response_mask_BT.sum()) == batch * tokens
    return {"side": side, "params": n_params, "rss_bare_mb": rss_bare, "rss_model_mb": rss_model,
            "peak_before_mb": peak_before, "peak_mb": _peak_mb(), "seconds": dt,
            "senior_frac": r.senior_token_frac(), "prompt_len": int(ids.shape[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1 if C.quick() else 2, help="fresh processes per side (copy: 1)")
    ap.add_argument("--child", choices=["solo", "tandem", "copy"])
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.tokens)))
        return

    res: dict[str, list[dict]] = {"solo": [], "tandem": [], "copy": []}
    for r in range(args.repeats):
        for side in (["solo", "tandem", "copy"] if r == 0 else ["tandem", "solo"]):
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", side, "--batch",
                                  str(args.batch), "--tokens", str(args.tokens)], capture_output=True, text=True,
                                 check=True, env=os.environ | {"PYTHONWARNINGS": "ignore"})
            res[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    peak = {k: [x["peak_mb"] for x in v] for k, v in res.items()}
    above = {k: [x["peak_mb"] - x["rss_bare_mb"] for x in v] for k, v in res.items()}
    s0 = res["solo"][0]
    kv_mb = BIG.layers * 2 * args.batch * BIG.kv_heads * (args.tokens + s0["prompt_len"]) * (BIG.hidden // BIG.heads) * 4 / 2**20
    detail = (f"LoRA r=16 on a {s0['params'] / 1e6:.1f}M-param {BIG} model (fp32 weights "
              f"{s0['params'] * 4 / 2**20:.0f} MB), B={args.batch}, {args.tokens} new tokens, one KV cache ≈ "
              f"{kv_mb:.0f} MB; peak RSS solo {C.fmt(peak['solo'], ' MB', 0)}, tandem (AdapterOff) "
              f"{C.fmt(peak['tandem'], ' MB', 0)}, tandem with a copied junior {C.fmt(peak['copy'], ' MB', 0)}; "
              f"above the bare interpreter: solo {C.fmt(above['solo'], ' MB', 0)}, tandem "
              f"{C.fmt(above['tandem'], ' MB', 0)}, copy {C.fmt(above['copy'], ' MB', 0)}; "
              f"rollout s: solo {C.fmt([x['seconds'] for x in res['solo']], 's', 1)}, tandem "
              f"{C.fmt([x['seconds'] for x in res['tandem']], 's', 1)}, copy {C.fmt([x['seconds'] for x in res['copy']], 's', 1)}; "
              f"{args.repeats} fresh processes per side (copy: 1)")
    C.record("P6", "peak RSS, self-paired LoRA tandem (AdapterOff junior) ÷ solo", C.ratios(peak["tandem"], peak["solo"]),
             "<= 1.2", detail)
    C.record("P6-above-bare", "same, memory above the bare interpreter", C.ratios(above["tandem"], above["solo"]),
             "<= 1.2", detail)
    C.record("P6-copy", "contrast: tandem with a deep-copied junior ÷ solo (peak RSS)",
             C.ratios(peak["copy"], peak["solo"][:1]), None, detail)


if __name__ == "__main__":
    main()
