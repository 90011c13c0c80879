"""Throughput check on one GPU: a few TRLVR and GRPO steps with a self-paired Qwen3-family model, each arm in
its own process, within a time budget.

    python scripts/gpu_check.py --model /path/to/Qwen3-0.6B     # (scripts/gpu_check.sh picks the interpreter)
    python scripts/gpu_check.py --random-4b                      # random Qwen3-4B-shaped weights (needs ~100 GB)
    python scripts/gpu_check.py --random-1.7b                    # Qwen3-1.7B-shaped: fits an 80 GB GPU
    python scripts/gpu_check.py --paper-step                     # one GPU's share of a paper step, bounded
    python scripts/gpu_check.py --cpu-smoke                      # a tiny random Qwen3 on the CPU

Every arm (engine x arm: hf/trlvr, hf/grpo, vllm/trlvr, vllm/grpo) runs in a process of its own: vLLM's
sleep-mode allocator allows one engine per process, an arm's environment (vLLM's model runner) cannot leak
into the next, and a failed arm loses nothing else. Each arm writes ``OUT/arm_<engine>_<arm>.json`` after every
step (``"complete": false`` until it ends), so what was measured survives a timeout. ``--budget-s`` bounds the
whole check: an arm that would not finish its next step in time stops, one still running at the budget's end
is stopped, and the check reports what it measured. vLLM runs where it is installed (``--engines auto``);
without it the in-process arms run and the check says that vLLM was not found.

Prints per arm the generated tokens/s, step time and its parts, peak GPU memory, the response lengths, and the
ratios a reader compares: TRLVR / GRPO step time, vLLM / in-process tokens/s, and achieved / peak HBM
bandwidth of the rollout (bytes the cost model says a decode reads, scripts/cost_model.py, over the measured
rollout time); writes them to ``OUT/gpu_check.json``. Everything is local: the problems are synthetic
arithmetic (``\\boxed{}`` answers scored by exact match); nothing is checkpointed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))  # this process; child processes (and vLLM's own) get PYTHONPATH: child_env()
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cost_model
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gpu_check_report import ARMS, achieved_bandwidth, arm_path, model_shape, report  # noqa: E402, F401
PAPER_STEP_TOKENS = 1024  # --paper-step's response cap unless --max-new-tokens says otherwise (see parse_args)
# Peak HBM bandwidth (bytes/s) by device name (datasheets); --peak-bw-tbs for another card.
PEAK_BW = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("A100-SXM4-80GB", 2.039e12),
           ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12), ("A10G", 0.6e12), ("L4", 0.3e12),
           ("RTX 4090", 1.008e12))


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; ``--cpu-smoke`` shrinks every size to seconds of CPU work."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local directory of a Qwen3-family causal LM (self-paired)")
    p.add_argument("--cpu-smoke", action="store_true", help="build a tiny random Qwen3 and run on the CPU")
    p.add_argument("--random-4b", action="store_true",
                   help="a randomly initialised Qwen3-4B-shaped model (no download) instead of --model; its float32 "
                        "training state and the vLLM engine need ~100 GB (an H200; not an 80 GB GPU)")
    p.add_argument("--random-1.7b", dest="random_1_7b", action="store_true",
                   help="a randomly initialised Qwen3-1.7B-shaped model (no download): fits an 80 GB GPU")
    p.add_argument("--ignore-memory-estimate", action="store_true",
                   help="run even where the memory estimate exceeds the GPU (default: refuse before any arm starts)")
    p.add_argument("--paper-step", action="store_true",
                   help="one GPU's share of a paper step: --random-4b, 8 prompts x 8 rollouts, micro-batch 1, 2 steps, "
                        f"responses up to {PAPER_STEP_TOKENS} tokens (the configs' 3,000 with --max-new-tokens 3000, "
                        "which does not fit a 15-minute budget), vLLM memory 0.4 (one unsharded GPU: ~130 GB, an H200)")
    p.add_argument("--steps", type=int, default=3, help="steps per arm (default 3; the first is warm-up)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per prompt (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response budget (default 512)")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="rollouts per forward/backward chunk (default 8: a 4B model's update fits 80 GB with "
                        "gradient checkpointing; 16 without it needs ~95 GB)")
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                   help="keep every activation (model.gradient_checkpointing: false)")
    p.add_argument("--dtype", default="float32", help="the senior's weights (float32: AdamW's master copy; on a GPU "
                   "the compute is bf16, model.mixed_precision)")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms (default trlvr,grpo)")
    p.add_argument("--engines", default="auto", help="comma-separated: hf, vllm (default auto: vllm where installed, and hf)")
    p.add_argument("--vllm-memory", type=float, default=None, help="rollout.vllm_memory (default 0.3)")
    p.add_argument("--vllm-sleep", default="weights", help="rollout.vllm_sleep of the vllm runs (default weights)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="stop after this many seconds and report what was measured (default 540: the whole check "
                        "ends within ~10 minutes, a 15-minute slot with the machine's start)")
    p.add_argument("--peak-bw-tbs", type=float, default=None, help="the GPU's peak HBM bandwidth in TB/s (default: by name)")
    p.add_argument("--out", default="runs/gpu_check", help="output directory (default runs/gpu_check)")
    p.add_argument("--child", choices=("prepare", "arm"), help=argparse.SUPPRESS)
    p.add_argument("--arm-spec", help=argparse.SUPPRESS)  # ENGINE/ARM of a --child arm
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)  # time.time() the arm must end by
    args = p.parse_args(argv)
    if args.paper_step:  # the shipped paper/trlvr config per GPU of two: 64 rollouts, micro-batch 1, checkpointing
        args.random_4b, args.steps, args.prompts, args.group_size, args.micro_batch = True, 2, 8, 8, 1
        args.max_new_tokens = args.max_new_tokens or PAPER_STEP_TOKENS
        args.vllm_memory = args.vllm_memory or 0.4  # 0.5 as in the configs does not fit one unsharded GPU
    args.max_new_tokens = args.max_new_tokens or 512
    args.vllm_memory = args.vllm_memory or 0.3
    if not args.cpu_smoke and not args.model and not random_shape(args):
        p.error("give --model DIR (or --cpu-smoke, --random-4b, --random-1.7b, --paper-step)")
    if args.cpu_smoke:
        args.steps, args.prompts, args.group_size = min(args.steps, 2), 2, 2
        args.max_new_tokens, args.micro_batch = min(args.max_new_tokens, 24), 4
    return args


def random_shape(args) -> str | None:
    """The random model's shape (a key of :data:`SHAPES`) the options ask for, else None."""
    return "4b" if args.random_4b else "1.7b" if getattr(args, "random_1_7b", False) else None


def child_env(env: dict | None = None) -> dict:
    """The environment of a child process: ``src/`` first on ``PYTHONPATH``, so the child and the processes it
    starts (vLLM inspects the plugin model in a subprocess of its own) import this checkout's ``tandem_rlvr``
    without an install (a ``sys.path`` insert does not reach them)."""
    env = dict(os.environ if env is None else env)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SRC)]
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *rest])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def vllm_found() -> bool:
    """Whether vLLM is installed (looked up, not imported: the parent process stays light)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engines(args, found: bool | None = None) -> list[str]:
    """The rollout engines to run: ``--engines``; ``auto`` = vllm where installed (the paper configs' engine),
    then hf."""
    found = vllm_found() if found is None else found
    if args.engines != "auto":
        return [e.strip() for e in args.engines.split(",") if e.strip()]
    return ["vllm", "hf"] if found else ["hf"]


def arm_specs(args, found: bool | None = None) -> list[str]:
    """``ENGINE/ARM`` of every child, in the order they run: both arms of an engine before the next engine, so
    an interrupted check still holds a TRLVR / GRPO pair."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    return [f"{e}/{a}" for e in engines(args, found) for a in arms]


def write_json(path: Path, obj) -> None:
    """Atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------------
# The models (built in the "prepare" child)
# ---------------------------------------------------------------------------------------------------------------


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


def _save(model, tok, out_dir: Path) -> Path:
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir


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
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return _save(Qwen3ForCausalLM(cfg), tok, out_dir)


# Qwen3's published shapes (config.json of Qwen3-4B and Qwen3-1.7B): layers, hidden, MLP, heads / KV heads of 128
SHAPES = {"4b": dict(num_hidden_layers=36, hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                     num_key_value_heads=8),
          "1.7b": dict(num_hidden_layers=28, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
                       num_key_value_heads=8)}


def build_random(out_dir: Path, shape: str = "4b") -> Path:
    """A randomly initialised model of a Qwen3 shape (:data:`SHAPES`; head dim 128, vocabulary 151,936, tied
    embeddings) with the local tokenizer of :func:`build_tiny_qwen3` (its ids are a subset of the rows)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(build_tiny_qwen3(out_dir.parent / "tiny-qwen3")))
    cfg = Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1e6,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    return _save(model, tok, out_dir)


def device_info(peak_bw_tbs: float | None = None) -> dict:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    mem = torch.cuda.get_device_properties(0).total_memory if cuda else None
    peak = peak_bw_tbs * 1e12 if peak_bw_tbs else next((bw for key, bw in PEAK_BW if key in name), None) if cuda else None
    return {"device": name, "gpu_bytes": mem, "gpu_gib": round(mem / 2**30, 1) if mem else None, "peak_bw": peak,
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__}


def prepare(args) -> int:
    """The "prepare" child: the model directory and ``OUT/env.json``; 2 on a setup problem."""
    out = Path(args.out)
    env = device_info(args.peak_bw_tbs)
    if args.cpu_smoke:
        model = str(build_tiny_qwen3(out / "tiny-qwen3"))
    elif env["device"] == "cpu":
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); install a CUDA build "
              "of torch, or use --cpu-smoke", file=sys.stderr)
        return 2
    elif random_shape(args):
        model = str(build_random(out / f"random-qwen3-{random_shape(args)}", random_shape(args)))
    else:
        model = str(Path(args.model).expanduser())
    write_json(out / "env.json", {**env, "model": model})
    return 0


# ---------------------------------------------------------------------------------------------------------------
# One arm (the "arm" child)
# ---------------------------------------------------------------------------------------------------------------


def make_config(args, arm: str, model: str, out: Path, engine: str = "hf"):
    """The run config of one arm: paper settings, scaled down to a few short steps."""
    import torch

    from tandem_rlvr.config import load_config

    half = "bf16" if torch.cuda.is_available() and args.dtype == "float32" else ""  # float32 weights, bf16 compute
    base = {  # the frozen junior in bf16 (as the paper configs): a float32 copy would add 4 B a parameter
        "model": {"senior": model, "self_paired": True, "dtype": args.dtype, "mixed_precision": half,
                  "junior_dtype": "bfloat16" if half else ""},
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
    cfg = load_config(base=base)
    cfg.model.gradient_checkpointing = args.gradient_checkpointing  # read with getattr by training/build.py
    return cfg


def _boxed_exact(text: str, gold: str) -> float:
    from tandem_rlvr.rewards import get_reward_fn

    return float(get_reward_fn("boxed_exact")(text, gold))


def _capture_lengths(trainer, rows: list):
    """Record each step's prompt and response lengths (the rollout the trainer makes) into ``rows[-1]``."""
    real = trainer.rollout

    def rollout(step):
        ro, idx = real(step)
        rows.append({"prompt_lens": [int(x) for x in ro.prompt_mask_BP.sum(-1).tolist()],
                     "response_lens": [int(x) for x in ro.response_mask_BT.sum(-1).tolist()]})
        return ro, idx

    trainer.rollout = rollout


def run_arm(args) -> int:
    """The "arm" child: ``args.steps`` steps of one arm on one engine, its JSON rewritten after every step."""
    import torch

    from tandem_rlvr.training.trainer import make_trainer

    out, (engine, arm) = Path(args.out), args.arm_spec.split("/")
    env = json.loads((out / "env.json").read_text(encoding="utf-8"))
    path = arm_path(out, args.arm_spec)
    cfg = make_config(args, arm, env["model"], out, engine)
    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    trainer = make_trainer(cfg, examples=synthetic_examples(max(64, args.prompts * args.steps)),
                           reward_fn=_boxed_exact, restart=True)
    load_s, rows, lengths = time.perf_counter() - t0, [], []
    _capture_lengths(trainer, lengths)
    stopped = None
    for step in range(args.steps):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        row = trainer.train_step(step)
        row["wall_s"] = time.perf_counter() - t
        row["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        rows.append({k: v for k, v in row.items() if isinstance(v, (int, float)) or v is None} | lengths[-1])
        print(f"  {engine}/{arm} step {step + 1}: {_describe(row, args)}", flush=True)
        done = step + 1 == args.steps
        if not done and args.deadline and time.time() + row["wall_s"] > args.deadline:
            stopped = f"the budget ends before step {step + 2} would (a step took {row['wall_s']:.0f} s)"
        write_json(path, {"engine": engine, "arm": arm, "load_s": load_s, "steps": rows, "env": env,
                          "complete": done or stopped is not None, "stopped": stopped,
                          "args": _args_dict(args) | {"dtype": cfg.model.dtype}})
        if stopped:
            print(f"  {engine}/{arm}: stopped: {stopped}", flush=True)
            break
    return 0


def _args_dict(args) -> dict:
    keys = ("prompts", "group_size", "max_new_tokens", "micro_batch", "gradient_checkpointing", "vllm_memory", "vllm_sleep")
    return {k: getattr(args, k) for k in keys}


def _describe(row: dict, args) -> str:
    n = row["rollout/response_len"] * args.prompts * args.group_size
    return (f"{row['wall_s']:.1f} s (rollout {row['time/rollout_s']:.1f} s, update {row['time/update_s']:.1f} s), "
            f"{n / max(row['time/rollout_s'], 1e-9):.0f} generated tokens/s, "
            f"response {row['rollout/response_len']:.0f} tokens, senior share {row['rollout/senior_token_frac']:.2f}")


# ---------------------------------------------------------------------------------------------------------------
# The parent: one child per arm, within the budget
# ---------------------------------------------------------------------------------------------------------------


def child_cmd(argv: list[str], extra: list[str]) -> list[str]:
    """This script again, with the parent's arguments and the child's own."""
    return [sys.executable, str(Path(__file__).resolve()), *argv, *extra]


def run_child(cmd: list[str], timeout_s: float) -> str:
    """Run ``cmd`` in its own process group (vLLM's engine processes go with it) with ``child_env()``;
    ``"ok"``, ``"exit N"``, or ``"stopped at the budget"`` after SIGTERM (then SIGKILL) to the group."""
    import signal

    proc = subprocess.Popen(cmd, env=child_env(), start_new_session=True)
    try:
        rc = proc.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
        return "stopped at the budget"
    return "ok" if rc == 0 else f"exit {rc}"


def memory_note(args, env: dict) -> str | None:
    """The estimated peak of one arm (cost_model.trainer_memory: float32 weights, gradients and AdamW states, the
    bf16 junior, then the update's activations and logits or the vLLM engine) when it exceeds the GPU: one line."""
    import cost_model

    if not env.get("gpu_bytes") or not (Path(env["model"]) / "config.json").exists():
        return None
    s = model_shape(env["model"])
    est = cost_model.trainer_memory(s["params"], hidden=s["hidden"], intermediate=s["intermediate"], layers=s["layers"],
                                    vocab=s["vocab"], micro=args.micro_batch, row_tokens=args.max_new_tokens + 200,
                                    response_tokens=args.max_new_tokens, checkpointing=args.gradient_checkpointing,
                                    vllm_bytes=args.vllm_memory * env["gpu_bytes"],
                                    weight_bytes=4 if args.dtype == "float32" else 2)
    worst = max(est["update"], est["rollout"])
    if worst <= env["gpu_bytes"]:
        return None
    return (f"gpu_check: an arm is estimated to need {worst / 1e9:.0f} GB of the GPU's {env['gpu_bytes'] / 1e9:.0f} GB "
            f"(training state {est['static'] / 1e9:.0f} GB; update {est['update'] / 1e9:.0f} GB, rollout "
            f"{est['rollout'] / 1e9:.0f} GB): use a smaller model (--random-1.7b, or --model), a GPU with more memory, "
            "or lower --micro-batch or --vllm-memory (--ignore-memory-estimate runs it anyway)")


def orchestrate(args, argv: list[str]) -> int:
    """Prepare the model, run every arm in its own process within ``--budget-s``, report; 2 on a setup problem."""
    deadline = time.time() + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.model and not args.cpu_smoke and not random_shape(args) and not Path(args.model).expanduser().is_dir():
        print(f"gpu_check: --model {args.model!r} is not a local directory", file=sys.stderr)
        return 2
    found = vllm_found()
    names, notes = engines(args, found), []
    if "vllm" in names and not found:
        print(f"gpu_check: --engines {args.engines}: vLLM was not found ({sys.executable} cannot import vllm); "
              "pip install vllm, or --engines hf", file=sys.stderr)
        return 2
    if not found:
        notes.append(f"gpu_check: vLLM was not found ({sys.executable} cannot import vllm): running the in-process "
                     "(hf) arms only; pip install vllm for the vLLM arms")
        print(notes[-1], flush=True)
    status = run_child(child_cmd(argv, ["--child", "prepare"]), deadline - time.time())
    if status != "ok":
        print(f"gpu_check: preparing the model failed ({status})", file=sys.stderr)
        return 2
    env = json.loads((out / "env.json").read_text(encoding="utf-8"))
    if (warn := memory_note(args, env)) is not None:
        if not args.ignore_memory_estimate:  # an out-of-memory arm would spend the budget and measure nothing
            print(f"{warn}; no arm was started", file=sys.stderr, flush=True)
            return 2
        notes.append(f"{warn} (--ignore-memory-estimate: run anyway)")
        print(notes[-1], file=sys.stderr, flush=True)
    specs, statuses = arm_specs(args, found), {}
    for spec in specs:
        left = deadline - time.time()
        if left < 30:
            statuses[spec] = "not run: the budget was spent"
            continue
        print(f"-- {spec}: {args.steps} steps of {args.prompts} prompts x {args.group_size} rollouts, "
              f"{args.max_new_tokens} new tokens, {left:.0f} s of the budget left", flush=True)
        statuses[spec] = run_child(child_cmd(argv, ["--child", "arm", "--arm-spec", spec, "--deadline", str(deadline)]),
                                   left + 15)
    summary = report(out, specs, statuses, notes)
    write_json(out / "gpu_check.json", summary)
    print(f"wrote {out / 'gpu_check.json'} and one arm_<engine>_<arm>.json per arm")
    return 1 if any(s.startswith("exit") for s in statuses.values()) else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child == "prepare":
        return prepare(args)
    if args.child == "arm":
        os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]  # vLLM's subprocesses inherit it
        return run_arm(args)
    return orchestrate(args, argv)


if __name__ == "__main__":
    raise SystemExit(main())
