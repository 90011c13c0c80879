"""P4: does legibility scoring run at the speed of a plain forward pass?

Legibility scoring = teacher-forced junior forward over prompt + response and, at every response
position, the junior's cross-entropy of the written token and its top-1 hit
(``tandem_rlvr.evaluation.evaluate.junior_legibility``, which also bins CE by position decile; if that module
is missing, ``trainer.sequence_logps`` + a top-1 from the same logits stand in, and the line says so).
The bare side is one batched ``junior(input_ids, attention_mask).logits`` over the same batch.
Both count the same response tokens, so tokens/s ratio = bare time ÷ scoring time. Target ≥ 0.9.
"""

from __future__ import annotations

import argparse

import common as C
import torch

from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4 if C.quick() else 12)
    args = ap.parse_args()

    tok = C.tokenizer()
    V = len(tok)
    senior, junior = C.model(V, C.SENIOR, 0), C.model(V, C.JUNIOR, 1)
    ids, mask = C.prompts(tok, args.batch)
    # the senior's solo chains, as the protocol scores them (EOS reachable: ragged lengths)
    ro = generate(senior, None, ids, mask, make_schedule("none"), Sampling(max_new_tokens=args.tokens, temperature=0.7),
                  eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, seed=0, record_junior=False)
    n_tok = int(ro.response_mask_BT.sum())
    full_ids = torch.cat([ro.prompt_ids_BP, ro.response_ids_BT], 1)
    full_mask = torch.cat([ro.prompt_mask_BP, ro.response_mask_BT], 1)

    try:
        from tandem_rlvr.evaluation.evaluate import junior_legibility

        impl = "evaluate.junior_legibility"

        def score():
            out = junior_legibility(junior, ro, score_batch=args.batch)
            assert out["junior_ce"].shape[0] == args.batch
    except ImportError:
        from tandem_rlvr.engines.scoring import sequence_logps

        impl = "trainer.sequence_logps + top-1 (evaluate.py absent)"

        @torch.inference_mode()
        def score():
            lp = sequence_logps(junior, ro, 1.0)
            ce = -(lp * ro.response_mask_BT).sum() / n_tok
            assert torch.isfinite(ce)

    @torch.inference_mode()
    def bare():
        junior(input_ids=full_ids, attention_mask=full_mask, use_cache=False).logits.sum()

    t = C.interleaved({"score": score, "bare": bare}, args.repeats)
    tps = {k: [n_tok / x for x in v] for k, v in t.items()}
    detail = (f"{impl}; B={args.batch}, {n_tok} response tokens (prompt {ids.shape[1]}, ≤{args.tokens} new), junior "
              f"{C.JUNIOR}; scoring {C.fmt(tps['score'], ' tok/s', 0)}, bare forward {C.fmt(tps['bare'], ' tok/s', 0)}, "
              f"{len(t['score'])} repeats")
    C.record("P4", "legibility scoring tokens/s ÷ bare batched forward tokens/s", C.ratios(t["bare"], t["score"]),
             ">= 0.9", detail)


if __name__ == "__main__":
    main()
