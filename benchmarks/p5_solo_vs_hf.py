"""P5: is our solo rollout at least as fast as ``transformers`` ``generate()``?

Solo generation tokens/s (``generate(senior, None, schedule none)``) ÷ ``model.generate`` tokens/s,
same model, prompts, sampling (temperature 0.6, no top-k / top-p) and token count (EOS unreachable
on our side, ``eos_token_id=None`` on HF's, so both run to ``max_new_tokens``). Target ≥ 1.0.
Ours also returns the per-token log-probs; HF is asked for nothing but the ids.
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
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3 if C.quick() else 8)
    args = ap.parse_args()

    tok = C.tokenizer()
    senior = C.model(len(tok), C.SENIOR, 0)
    senior.generation_config.eos_token_id = None
    ids, mask = C.prompts(tok, args.batch)
    n = args.tokens
    sampling = Sampling(max_new_tokens=n, temperature=0.6)
    none = make_schedule("none")

    def ours():
        r = generate(senior, None, ids, mask, none, sampling, eos_token_ids=C.NO_EOS,
                     pad_token_id=tok.pad_token_id, seed=0, record_junior=False)
        assert r.response_ids_BT.shape[1] == n

    @torch.inference_mode()
    def hf():
        out = senior.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.6, top_k=0,
                              top_p=1.0, max_new_tokens=n, min_new_tokens=0, eos_token_id=None,
                              pad_token_id=tok.pad_token_id)
        assert out.shape[1] == ids.shape[1] + n

    t = C.interleaved({"ours": ours, "hf": hf}, args.repeats)
    tps = {k: [args.batch * n / x for x in v] for k, v in t.items()}
    detail = (f"B={args.batch}, {n} new tokens, prompt {ids.shape[1]}, senior {C.SENIOR}, T=0.6; "
              f"ours {C.fmt(tps['ours'], ' tok/s', 0)}, HF generate {C.fmt(tps['hf'], ' tok/s', 0)}, "
              f"{len(t['ours'])} repeats")
    C.record("P5", "solo tokens/s ÷ transformers generate() tokens/s", C.ratios(t["hf"], t["ours"]), ">= 1.0", detail)


if __name__ == "__main__":
    main()
