"""Throughput check on one GPU: a few TRLVR steps and a few GRPO steps with a small self-paired model.

    python scripts/gpu_check.py --model /path/to/Qwen3-0.6B          # (scripts/gpu_check.sh sets up the venv)
    python scripts/gpu_check.py --cpu-smoke                          # a tiny random Qwen3 on the CPU
    python scripts/gpu_check.py --paper-step                         # one GPU's share of a paper step

Prints, for each arm, the generated tokens per second of the rollout, the step time and its parts,
peak GPU memory, and the TRLVR / GRPO ratios; writes them to ``OUT/gpu_check.json``. Everything is
local: the training problems are synthetic arithmetic (``\\boxed{}`` answers scored by exact match),
so no hub or dataset access is needed. Nothing is checkpointed. With ``--engines hf,vllm`` each arm
runs on both engines: on ``vllm`` TRLVR decodes on the dual engine (one vLLM engine holding both
models, one request per rollout; ``tandem_rlvr.engines.vllm_dual``) and GRPO on a plain one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # works without pip install -e .

ARMS = ("trlvr", "grpo")


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; ``--cpu-smoke`` shrinks every size to a few seconds of CPU work."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local directory of a small Qwen3-family causal LM (self-paired)")
    p.add_argument("--cpu-smoke", action="store_true", help="build a tiny random Qwen3 and run on the CPU")
    p.add_argument("--steps", type=int, default=3, help="steps per arm (default 3; the first is warm-up)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="response budget (default 512)")
    p.add_argument("--micro-batch", type=int, default=16, help="rollouts per forward/backward chunk (default 16)")
    p.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms (default trlvr,grpo)")
    p.add_argument("--engines", default="auto",
                   help="comma-separated rollout engines: hf, vllm (default auto: hf, and vllm where it imports)")
    p.add_argument("--random-4b", action="store_true",
                   help="build a randomly initialised Qwen3-4B-shaped model from a config (no download) instead of --model")
    p.add_argument("--vllm-memory", type=float, default=0.3, help="rollout.vllm_memory of the vllm runs (default 0.3)")
    p.add_argument("--vllm-sleep", default="weights", help="rollout.vllm_sleep of the vllm runs (default weights)")
    p.add_argument("--paper-step", action="store_true",
                   help="one GPU's share of a step of the paper's run: --random-4b, 8 prompts x 8 rollouts of up to "
                        "3,000 tokens, micro-batch 1, 2 steps, both engines, the paper configs' vLLM memory settings")
    p.add_argument("--out", default="runs/gpu_check", help="output directory (default runs/gpu_check)")
    args = p.parse_args(argv)
    if args.paper_step:  # configs/paper/trlvr.yaml per GPU of two: 64 rollouts; the weights in bf16 on one GPU
        args.random_4b, args.steps, args.prompts, args.group_size = True, 2, 8, 8
        args.max_new_tokens, args.micro_batch, args.vllm_memory = 3000, 1, 0.5
        args.engines = "hf,vllm" if args.engines == "auto" else args.engines
    if not args.cpu_smoke and not args.model and not args.random_4b:
        p.error("give --model DIR (or --cpu-smoke, --random-4b, --paper-step)")
    if args.cpu_smoke:
        args.steps, args.prompts, args.group_size = min(args.steps, 3), 2, 2
        args.max_new_tokens, args.micro_batch = min(args.max_new_tokens, 24), 4
    return args


def synthetic_examples(n: int, seed: int = 0):
    """``n`` two-operand arithmetic problems with integer answers (no data download needed)."""
    from tandem_rlvr.data import Example

    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        op = rng.choice(["+", "-", "*"])
        ans = {"+": a + b, "-": a - b, "*": a * b}[op]
        out.append(Example(id=str(i), problem=f"Compute {a} {op} {b}.", answer=str(ans)))
    return out


def build_tiny_qwen3(out_dir: Path) -> Path:
    """A tiny random Qwen3 with a locally trained byte-level BPE tokenizer, saved to ``out_dir``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tandem_rlvr.data import build_user_turn
    from tandem_rlvr.world.tokenizer import build_tokenizer

    corpus = [build_user_turn(ex.problem) + f" {ex.answer} is \\boxed{{{ex.answer}}}.\n\n" for ex in synthetic_examples(200)]
    tok = build_tokenizer(corpus, vocab_size=400)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir


def build_random_4b(out_dir: Path) -> Path:
    """A randomly initialised model of Qwen3-4B's shape (36 layers, hidden 2560, 32/8 heads of 128) with the
    local BPE tokenizer of :func:`build_tiny_qwen3` (its ids are a subset of the 151,936 rows)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tiny = build_tiny_qwen3(out_dir.parent / "tiny-qwen3")
    tok = AutoTokenizer.from_pretrained(str(tiny))
    cfg = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      rope_theta=1e6, tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    del model
    return out_dir


def engines(args) -> list[str]:
    """The rollout engines to run: ``--engines``, ``auto`` = hf plus vllm where it imports."""
    if args.engines != "auto":
        return [e.strip() for e in args.engines.split(",") if e.strip()]
    from tandem_rlvr.engines.vllm_backend import vllm_available

    return ["hf", "vllm"] if vllm_available() else ["hf"]


def make_config(args, arm: str, model: str, out: Path, engine: str = "hf"):
    """The run config of one arm: paper settings, scaled down to a few short steps."""
    import torch

    from tandem_rlvr.config import load_config

    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    base = {
        "model": {"senior": model, "self_paired": True, "dtype": dtype},
        "algo": {"arm": arm, "group_size": args.group_size, "loss_type": "dapo", "lr": 1e-6, "clip_eps": 0.2,
                 "mini_batch_prompts": max(1, args.prompts // 2), "micro_batch": args.micro_batch},
        "handoff": {"schedule": "word", "p": 0.5, "max_gap": 32},
        "rollout": {"max_new_tokens": args.max_new_tokens, "max_prompt_tokens": 1024, "temperature": 0.6,
                    "engine": engine, "vllm_memory": args.vllm_memory, "vllm_sleep": args.vllm_sleep},
        "train": {"steps": args.steps, "prompts_per_step": args.prompts, "save_every": 0, "progress": False,
                  "out_dir": str(out / f"run_{arm}_{engine}")},
        "data": {"train": "synthetic", "reward": "boxed_exact"},
    }
    if args.cpu_smoke:  # a handful of 24-token rollouts: the share of senior tokens is noisy
        base["algo"]["senior_frac_band"] = [0.0, 1.0]
    return load_config(base=base)


def _boxed_exact(text: str, gold: str) -> float:
    from tandem_rlvr.rewards import get_reward_fn

    return float(get_reward_fn("boxed_exact")(text, gold))


def run_arm(args, arm: str, model: str, out: Path, engine: str = "hf") -> dict:
    """Run ``args.steps`` steps of one arm on one rollout engine; return its timing summary."""
    import torch

    from tandem_rlvr.training.trainer import make_trainer

    cfg = make_config(args, arm, model, out, engine)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = make_trainer(cfg, examples=synthetic_examples(max(64, args.prompts * args.steps)),
                      reward_fn=_boxed_exact, restart=True)
    load_s = time.perf_counter() - t0
    rows = []
    for step in range(args.steps):
        t = time.perf_counter()
        row = trainer.train_step(step)
        row["wall_s"] = time.perf_counter() - t
        rows.append(row)
        print(f"  {arm}/{engine} step {step + 1}: {_describe(row, args)}", flush=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summarize(arm, rows, args, load_s, peak)


def _tokens(row: dict, args) -> float:
    return row["rollout/response_len"] * args.prompts * args.group_size


def _describe(row: dict, args) -> str:
    return (f"{row['wall_s']:.1f} s (rollout {row['time/rollout_s']:.1f} s, update {row['time/update_s']:.1f} s), "
            f"{_tokens(row, args) / row['time/rollout_s']:.0f} generated tokens/s, "
            f"response {row['rollout/response_len']:.0f} tokens, senior share {row['rollout/senior_token_frac']:.2f}")


def summarize(arm: str, rows: list[dict], args, load_s: float, peak_gib: float | None) -> dict:
    """Means over the timed steps (all but the first, warm-up step, when there are several)."""
    timed = rows[1:] if len(rows) > 1 else rows
    mean = lambda key: sum(r[key] for r in timed) / len(timed)
    tokens = sum(_tokens(r, args) for r in timed)
    return {
        "arm": arm, "steps": len(rows), "timed_steps": len(timed), "load_s": load_s,
        "step_s": mean("wall_s"), "rollout_s": mean("time/rollout_s"), "update_s": mean("time/update_s"),
        "response_len": mean("rollout/response_len"), "senior_token_frac": mean("rollout/senior_token_frac"),
        "gen_tokens_per_s": tokens / sum(r["time/rollout_s"] for r in timed),
        "step_tokens_per_s": tokens / sum(r["wall_s"] for r in timed),
        "s_per_1k_tokens": 1000 * sum(r["wall_s"] for r in timed) / max(tokens, 1.0),
        "peak_gpu_gib": peak_gib,
    }


def report(results: dict[str, dict], env: dict) -> dict:
    """Print the table and the TRLVR / GRPO ratios; return everything as one dict."""
    print("\n== gpu_check: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    cols = ("step_s", "rollout_s", "update_s", "gen_tokens_per_s", "step_tokens_per_s", "response_len", "peak_gpu_gib")
    print(f"{'arm':12s}" + "".join(f"{c:>19s}" for c in cols))
    for arm, r in results.items():
        print(f"{arm:12s}" + "".join(f"{(r[c] if r[c] is not None else float('nan')):19.2f}" for c in cols))
    ratios = {}
    for sfx in ("", "/hf", "/vllm"):
        t, g = results.get("trlvr" + sfx), results.get("grpo" + sfx)
        if t and g:
            ratios.update({f"step_time_trlvr_over_grpo{sfx}": t["step_s"] / g["step_s"],
                           f"gen_tokens_per_s_trlvr_over_grpo{sfx}": t["gen_tokens_per_s"] / g["gen_tokens_per_s"],
                           f"time_per_token_trlvr_over_grpo{sfx}": t["s_per_1k_tokens"] / g["s_per_1k_tokens"]})
    for arm in ARMS:
        v, h = results.get(f"{arm}/vllm"), results.get(f"{arm}/hf")
        if v and h:
            ratios[f"gen_tokens_per_s_vllm_over_hf/{arm}"] = v["gen_tokens_per_s"] / h["gen_tokens_per_s"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    return {"env": env, "arms": results, "ratios": ratios}


def _env(args, model: str) -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    return {"device": gpu, "gpu_gib": round(mem, 1) if mem else None, "torch": torch.__version__,
            "transformers": transformers.__version__, "model": model, "prompts": args.prompts,
            "group_size": args.group_size, "max_new_tokens": args.max_new_tokens}


def main(argv=None) -> int:
    """Run every arm, print the summary, write ``OUT/gpu_check.json``; 2 on a setup problem."""
    args = parse_args(argv)
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cpu_smoke:
        model = str(build_tiny_qwen3(out / "tiny-qwen3"))
    elif args.random_4b:
        model = str(build_random_4b(out / "random-qwen3-4b"))
    else:
        model = args.model
        if not Path(model).expanduser().is_dir():
            print(f"gpu_check: --model {model!r} is not a local directory", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); "
                  "install a CUDA build of torch, or use --cpu-smoke", file=sys.stderr)
            return 2
    env = _env(args, model)
    if env["gpu_gib"] is not None and env["gpu_gib"] < 75:
        print(f"gpu_check: warning: {env['gpu_gib']} GiB on the GPU; this check is sized for >= 80 GB", file=sys.stderr)
    results = {}
    names = engines(args)
    for engine in names:
        for arm in [a.strip() for a in args.arms.split(",") if a.strip()]:
            print(f"-- {arm} on {engine}: {args.steps} steps of {args.prompts} prompts x {args.group_size} rollouts, "
                  f"{args.max_new_tokens} new tokens", flush=True)
            key = arm if names == ["hf"] else f"{arm}/{engine}"
            results[key] = run_arm(args, arm, model, out, engine)
    summary = report(results, env)
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
