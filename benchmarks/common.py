"""Shared helpers for the side-by-side benchmarks: tiny local models, prompts, timing, results.

Every benchmark runs both sides in one process on the same random-init models (no hub, no network),
interleaves the two sides repeat by repeat (so load from other users of the machine hits both alike),
and reports the per-repeat ratio's min / median / max. Results are appended to ``RESULTS.md``.
"""

from __future__ import annotations

import datetime as _dt
import gc
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# One intra-op thread: on a small shared machine, OpenMP threads spinning against other users'
# processes make tiny kernels 10-100x slower and the timings meaningless.
torch.set_num_threads(int(os.environ.get("TANDEM_BENCH_THREADS", "1")))

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS.md"
CACHE = Path(os.environ.get("TANDEM_BENCH_CACHE", "/tmp/tandem_rlvr_bench"))
NO_EOS = [-1]  # an id no model can emit: every rollout runs to max_new_tokens ("same tokens")

if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


# ------------------------------------------------------------------------------------ models


def tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer (``Ġ`` word starts, ChatML template) trained on the arithmetic world."""
    from transformers import AutoTokenizer

    d = CACHE / f"tok{vocab_size}"
    if not (d / "tokenizer.json").exists():
        _build_tokenizer(d, vocab_size)
    tok = AutoTokenizer.from_pretrained(str(d))
    tok.padding_side = "left"
    return tok


def _build_tokenizer(d: Path, vocab_size: int) -> None:
    """Byte-level BPE on arithmetic-world text, built here (not via the library) so it stays fixed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tandem_rlvr.world.problems import generate_problem, plain_solution

    rng = random.Random(0)
    corpus = []
    for _ in range(3000):
        p = generate_problem(rng, rng.randint(2, 6))
        corpus.append(p.text + " " + plain_solution(p))
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    d.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(d))


@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int = 4
    kv_heads: int = 2

    def __str__(self) -> str:
        return f"h{self.hidden}xL{self.layers}"


SENIOR = Size(128, 4)
JUNIOR = Size(64, 2)


def model(vocab_size: int, size: Size = SENIOR, seed: int = 0, max_pos: int = 4096):
    """A random-init Qwen2 causal LM (eval mode, fp32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=size.hidden, intermediate_size=size.hidden * 2,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
        max_position_embeddings=max_pos, tie_word_embeddings=True, pad_token_id=0,
    )
    return Qwen2ForCausalLM(cfg).eval()


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def prompts(tok, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` left-padded chat prompts of different lengths (world problems)."""
    from tandem_rlvr.data import render_prompt
    from tandem_rlvr.world.problems import generate_problem

    rng = random.Random(seed)
    texts = [render_prompt(tok, generate_problem(rng, rng.randint(2, 6)).text) for _ in range(batch)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


# ------------------------------------------------------------------------------------ timing


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stats(xs: list[float]) -> tuple[float, float, float]:
    return min(xs), statistics.median(xs), max(xs)


def fmt(xs: list[float], unit: str = "", digits: int = 3) -> str:
    lo, med, hi = stats(xs)
    return f"{med:.{digits}f}{unit} [{lo:.{digits}f}–{hi:.{digits}f}]"


def interleaved(sides: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                budget_s: float | None = None) -> dict[str, list[float]]:
    """Time every side ``repeats`` times, alternating sides (and their order) on each repeat.

    ``budget_s`` stops early (after at least 3 repeats) once the wall time is spent.
    """
    names = list(sides)
    for _ in range(warmup):
        for n in names:
            sides[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    t_start = time.perf_counter()
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            out[n].append(timed(sides[n]))
        if budget_s is not None and r >= 2 and time.perf_counter() - t_start > budget_s:
            break
    return out


def ratios(num: list[float], den: list[float]) -> list[float]:
    """Per-repeat ratios (the two sides of one repeat ran back to back)."""
    return [a / b for a, b in zip(num, den)]


# ------------------------------------------------------------------------------------ results


# The CPU flags that change which kernels PyTorch, MKL and oneDNN run (their speed and their float order), and
# the variables that hold those libraries to a smaller instruction set than the CPU has.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
ISA_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_description(cpuinfo: str, capability: str, environ) -> str:
    """The CPU model with its instruction-set flags (``ISA_FLAGS``, from ``/proc/cpuinfo``'s text), the kernels
    PyTorch chose (``capability``: ``torch.backends.cpu.get_cpu_capability()``) and any ``ISA_ENV`` variable
    set in ``environ``: what a timing or a last digit depends on besides the clock."""
    model, flags = None, None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            flags = set(value.split())
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    isa = "flags unknown" if flags is None else (" ".join(f for f in ISA_FLAGS if f in flags) or "no AVX2")
    held = [f"{k}={environ[k]}" for k in ISA_ENV if environ.get(k)]
    return f"{model} ({isa}), torch kernels {capability}" + (f", held by {' '.join(held)}" if held else "")


def machine() -> str:
    """The machine a result was measured on: CPU model and flags, PyTorch's kernels, cores and threads."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    cpu = cpu_description(text, torch.backends.cpu.get_cpu_capability(), os.environ)
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def versions() -> str:
    import transformers

    parts = [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    try:
        import trl

        parts.append(f"trl {trl.__version__}")
    except ImportError:
        parts.append("trl not installed")
    return ", ".join(parts)


def record(name: str, question: str, ratio: list[float] | None, target: str | None, detail: str,
           met: bool | None = None) -> str:
    """Print and append one result line to ``RESULTS.md``; returns the line."""
    ensure_header()
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    r = fmt(ratio) if ratio else "—"
    if met is None and ratio and target:
        met = _meets(statistics.median(ratio), target)
    m = "—" if met is None else ("yes" if met else "**no**")
    line = f"| {when} | {name} | {question} | {r} | {target or '—'} | {m} | {detail} | {machine()} | {versions()} |"
    with RESULTS.open("a") as f:
        f.write(line + "\n")
    print(f"{name}: ratio {r} (target {target or '—'}, met: {m}) — {detail}", flush=True)
    return line


def ensure_header() -> None:
    if not RESULTS.exists():
        RESULTS.write_text(
            "# Benchmark results\n\n"
            "Appended by `benchmarks/*.py` (run all: `bash benchmarks/run_all.sh`). Ratios are median "
            "[min–max] of per-repeat ratios; the two sides of a repeat run back to back, alternating "
            "order, on a machine shared with other jobs (so the spread is mostly their load).\n\n"
            "| date | id | question | ratio median [min–max] | target | met | details | machine | versions |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        )


def _meets(x: float, target: str) -> bool:
    op, val = target.split()
    v = float(val)
    return {"<=": x <= v, ">=": x >= v, "≤": x <= v, "≥": x >= v}[op]


def quick() -> bool:
    """``TANDEM_BENCH_QUICK=1``: fewer repeats and smaller sizes (a smoke run)."""
    return os.environ.get("TANDEM_BENCH_QUICK", "") not in ("", "0")


if __name__ == "__main__":  # run_all.sh: header + a marker line for this run
    ensure_header()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    with RESULTS.open("a") as f:
        f.write(f"| {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} | run | run_all.sh{' (quick)' if quick() else ''} "
                f"| — | — | — | load average {' '.join(load)} at start | {machine()} | {versions()} |\n")
