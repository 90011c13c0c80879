"""P2: what do per-model KV caches buy over the obvious tandem loop?

The naive loop is what one writes with ``transformers`` alone: per turn, group the rows by their
current author and call that model's ``generate()`` on the *full* history (prompt + every token so
far, re-padded and re-encoded from scratch), sampling until each row emits a word-start token (a
``StoppingCriteria``) or ``max_gap`` tokens; keep each row's tokens up to and including its first
word start, append them to the history and redraw the author with a coin (P(senior) = 0.5). That
is exactly the ``word`` schedule (redraw after each boundary token or K tokens), batched over rows,
with KV caches inside each ``generate()`` call but none across turns.

Ratio = naive time ÷ our tandem rollout time (lockstep and catch-up), same models, prompts,
sampling (temperature 0.6) and number of new tokens per row (no EOS). Target ≥ 10.

Turn length matters (the naive loop pays one re-encoding per turn). The paper's turns are ≈ 2 words;
in real text ~75% of BPE tokens start a word, so a turn is ≈ 2.7 tokens. Random-init models pick
word starts at their share of the vocabulary (27% here, ≈ 7 tokens per turn). ``--word-rate 0.75``
(default) adds one logit bias to the word-start tokens of both models, on both sides alike, so the
text has the paper's token-per-word rate; ``--word-rate 0`` leaves the models as they are.
"""

from __future__ import annotations

import argparse

import common as C
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling


class _WordStart(StoppingCriteria):
    """Per-row stop once the newest token starts a word."""

    def __init__(self, boundary_V: torch.Tensor):
        self.boundary_V = boundary_V

    def __call__(self, input_ids, scores, **kwargs):
        return self.boundary_V[input_ids[:, -1]]


@torch.inference_mode()
def naive_tandem(senior, junior, prompts: list[list[int]], n_new: int, boundary_V: torch.Tensor, *,
                 p: float, max_gap: int, temperature: float, pad_id: int, seed: int) -> tuple[list[list[int]], int]:
    """Returns the responses and the number of ``generate()`` calls."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    hist = [list(x) for x in prompts]
    resp: list[list[int]] = [[] for _ in prompts]
    author = (torch.rand(len(prompts), generator=gen) < p).tolist()
    stop = StoppingCriteriaList([_WordStart(boundary_V)])
    calls = 0
    while any(len(r) < n_new for r in resp):
        for is_senior, model in ((True, senior), (False, junior)):
            rows = [b for b in range(len(prompts)) if author[b] == is_senior and len(resp[b]) < n_new]
            if not rows:
                continue
            width = max(len(hist[b]) for b in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for i, b in enumerate(rows):
                ids[i, width - len(hist[b]):] = torch.tensor(hist[b])
                mask[i, width - len(hist[b]):] = 1
            budget = min(max_gap, max(n_new - len(resp[b]) for b in rows))
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                 top_k=0, top_p=1.0, max_new_tokens=budget, eos_token_id=None,
                                 pad_token_id=pad_id, stopping_criteria=stop)
            calls += 1
            new = out[:, width:]
            for i, b in enumerate(rows):
                seg = new[i].tolist()
                hits = boundary_V[new[i]].nonzero()
                cut = int(hits[0]) + 1 if len(hits) else len(seg)
                seg = seg[:min(cut, n_new - len(resp[b]))]
                resp[b] += seg
                hist[b] += seg
        author = (torch.rand(len(prompts), generator=gen) < p).tolist()
    return resp, calls


def bias_word_starts(model, boundary_V: torch.Tensor, rate: float, temperature: float) -> None:
    """Add one logit bias to word-start tokens so that ≈ ``rate`` of sampled tokens start a word."""
    n_b = float(boundary_V.sum())
    n_o = float(boundary_V.numel() - n_b)
    bias = temperature * float(torch.log(torch.tensor(rate / (1 - rate) * n_o / n_b)))
    add = boundary_V.float() * bias

    def hook(_module, _inputs, output):
        return output + add[: output.shape[-1]]

    model.get_output_embeddings().register_forward_hook(hook)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2 if C.quick() else 3)
    ap.add_argument("--word-rate", type=float, default=0.75, help="share of word-start tokens (0 = models as-is)")
    args = ap.parse_args()

    tok = C.tokenizer()
    V = len(tok)
    senior, junior = C.model(V, C.SENIOR, 0), C.model(V, C.JUNIOR, 1)
    for m in (senior, junior):
        m.generation_config.eos_token_id = None
    ids, mask = C.prompts(tok, args.batch)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    word = make_schedule("word", tok, p=0.5, max_gap=32)
    if args.word_rate > 0:
        for m in (senior, junior):
            bias_word_starts(m, word.table.boundary_V, args.word_rate, 0.6)
    sampling = Sampling(max_new_tokens=args.tokens, temperature=0.6)
    info = {}

    def ours(mode):
        def run():
            r = generate(senior, junior, ids, mask, word, sampling, eos_token_ids=C.NO_EOS,
                         pad_token_id=tok.pad_token_id, seed=0, mode=mode)
            info["rounds"] = float(r.rounds_B.float().mean())
            info["rate"] = float(word.table.boundary_V[r.response_ids_BT].float().mean())
        return run

    def naive():
        resp, calls = naive_tandem(senior, junior, prompts, args.tokens, word.table.boundary_V, p=0.5, max_gap=32,
                                   temperature=0.6, pad_id=tok.pad_token_id, seed=0)
        assert all(len(r) == args.tokens for r in resp)
        info["calls"] = calls

    t = C.interleaved({"naive": naive, "lockstep": ours("lockstep"), "catchup": ours("catchup")}, args.repeats, warmup=0)
    detail = (f"B={args.batch}, {args.tokens} new tokens, prompt {ids.shape[1]}, word p=0.5 K=32, T=0.6, "
              f"word-start share {info['rate']:.2f} ({'biased' if args.word_rate > 0 else 'models as-is'}), "
              f"{args.batch * args.tokens / info['rounds'] / args.batch:.1f} tokens/turn; "
              f"naive {C.fmt(t['naive'], 's', 2)} ({info['calls']} generate() calls), ours lockstep "
              f"{C.fmt(t['lockstep'], 's', 2)}, catchup {C.fmt(t['catchup'], 's', 2)} "
              f"({info['rounds']:.0f} turns/row); {len(t['naive'])} repeats")
    tag = "P2" if args.word_rate > 0 else "P2-raw"
    C.record(tag, "naive tandem loop (generate() per turn, history re-encoded) ÷ our tandem (lockstep)",
             C.ratios(t["naive"], t["lockstep"]), ">= 10", detail)
    C.record(tag + "-catchup", "naive tandem loop ÷ our tandem (catchup)", C.ratios(t["naive"], t["catchup"]),
             ">= 10", detail)


if __name__ == "__main__":
    main()
