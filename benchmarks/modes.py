"""Lockstep vs catch-up (DESIGN.md "The dual decoder"): which forward pattern is cheaper, where?

Same models, prompts, seed and token count in both modes (the engine gives identical tokens, owners
and log-probs either way; tests/engines/test_rollout.py checks it). Reported per setting: time ratio
catch-up ÷ lockstep (< 1: catch-up wins) and the number of model forwards in each mode.

Settings: word turns (p = 0.5) on a training-size batch and on one row; 32-token chunks (long turns)
on both; and a solo rollout that records the junior's log-probs (``record_junior``, e.g. for drift
metrics or KL-Reg), where catch-up runs the junior once, teacher-forced, at the end.
"""

from __future__ import annotations

import argparse

import common as C
import torch

from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling


class _Count:
    def __init__(self, *models):
        self.n = 0
        for m in models:
            m.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2 if C.quick() else 5)
    args = ap.parse_args()

    tok = C.tokenizer()
    V = len(tok)
    senior, junior = C.model(V, C.SENIOR, 0), C.model(V, C.JUNIOR, 1)
    count = _Count(senior, junior)
    settings = [
        ("word p=0.5", make_schedule("word", tok, p=0.5), 8, True),
        ("word p=0.5", make_schedule("word", tok, p=0.5), 1, True),
        ("chunk 32, p=0.5", make_schedule("chunk", p=0.5, chunk_size=32), 8, True),
        ("chunk 32, p=0.5", make_schedule("chunk", p=0.5, chunk_size=32), 1, True),
        ("solo + record_junior", make_schedule("none"), 8, True),
    ]
    sampling = Sampling(max_new_tokens=args.tokens, temperature=0.6)
    for name, sch, B, rec in settings:
        ids, mask = C.prompts(tok, B)
        forwards = {}

        def run(mode, ids=ids, mask=mask, sch=sch, rec=rec, forwards=forwards):
            def go():
                before = count.n
                r = generate(senior, junior, ids, mask, sch, sampling, eos_token_ids=C.NO_EOS,
                             pad_token_id=tok.pad_token_id, seed=0, record_junior=rec, mode=mode)
                forwards[mode] = count.n - before
                return r
            return go

        a, b = run("lockstep")(), run("catchup")()
        assert torch.equal(a.response_ids_BT, b.response_ids_BT) and torch.equal(a.owner_BT, b.owner_BT)
        dlp = float((a.junior_logps_BT - b.junior_logps_BT).abs().max())
        t = C.interleaved({"lockstep": run("lockstep"), "catchup": run("catchup")}, args.repeats, warmup=0)
        C.record(f"M {name} B={B}", f"catch-up ÷ lockstep time, {name}, B={B}", C.ratios(t["catchup"], t["lockstep"]),
                 None, f"{args.tokens} tokens; forwards lockstep {forwards['lockstep']}, catchup {forwards['catchup']}; "
                 f"lockstep {C.fmt(t['lockstep'], 's')}, catchup {C.fmt(t['catchup'], 's')}; same tokens/owners, "
                 f"max |Δ junior logp| {dlp:.1e}; {len(t['lockstep'])} repeats")


if __name__ == "__main__":
    main()
