"""P1: is a tandem rollout as cheap as running the two models alone?

tandem rollout time (word handoffs, p = 0.5) ÷ (senior solo + junior solo rollout time), same prompts
and the same number of generated tokens (EOS unreachable: every row runs to ``max_new_tokens``).
Target ≤ 1.10. Both tandem modes are timed; the target is judged on the default (``lockstep``).
"""

from __future__ import annotations

import argparse

import common as C

from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=4 if C.quick() else 12)
    args = ap.parse_args()

    tok = C.tokenizer()
    V = len(tok)
    senior, junior = C.model(V, C.SENIOR, 0), C.model(V, C.JUNIOR, 1)
    ids, mask = C.prompts(tok, args.batch)
    sampling = Sampling(max_new_tokens=args.tokens, temperature=0.6)
    word, none = make_schedule("word", tok, p=0.5), make_schedule("none")
    kw = {"eos_token_ids": C.NO_EOS, "pad_token_id": tok.pad_token_id, "seed": 0}

    def tandem(mode):
        return lambda: generate(senior, junior, ids, mask, word, sampling, mode=mode, **kw)

    def solo(m):
        return lambda: generate(m, None, ids, mask, none, sampling, record_junior=False, **kw)

    r = tandem("lockstep")()
    assert r.response_mask_BT.sum() == args.batch * args.tokens, "every row must generate the same tokens"
    frac, rounds = r.senior_token_frac(), float(r.rounds_B.float().mean())
    t = C.interleaved({"lockstep": tandem("lockstep"), "catchup": tandem("catchup"),
                       "senior": solo(senior), "junior": solo(junior)}, args.repeats)
    solo_sum = [a + b for a, b in zip(t["senior"], t["junior"])]
    setup = (f"B={args.batch}, {args.tokens} new tokens, prompt {ids.shape[1]}, senior {C.SENIOR} "
             f"({C.n_params(senior) / 1e6:.2f}M), junior {C.JUNIOR} ({C.n_params(junior) / 1e6:.2f}M), "
             f"T=0.6, senior frac {frac:.2f}, {rounds:.1f} turns/row, {len(solo_sum)} repeats")
    times = (f"tandem lockstep {C.fmt(t['lockstep'], 's')}, catchup {C.fmt(t['catchup'], 's')}, "
             f"senior solo {C.fmt(t['senior'], 's')}, junior solo {C.fmt(t['junior'], 's')}")
    C.record("P1", "tandem (word, p=0.5, lockstep) ÷ (senior solo + junior solo)",
             C.ratios(t["lockstep"], solo_sum), "<= 1.10", f"{setup}; {times}")
    C.record("P1-catchup", "tandem (word, p=0.5, catchup) ÷ (senior solo + junior solo)",
             C.ratios(t["catchup"], solo_sum), "<= 1.10", f"{setup}; {times}")


if __name__ == "__main__":
    main()
