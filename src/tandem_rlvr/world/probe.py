"""Small probes of the warm-started world models: batched completion and accuracy by length and style.

This is a self-contained sanity harness for the world (used by its tests and build report), not the
library's rollout engine: it uses ``model.generate`` with left padding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from tandem_rlvr.data import render_prompt
from tandem_rlvr.world.problems import (
    Problem,
    generate_split,
    is_correct,
    is_jargon,
    jargon_steps,
    plain_steps,
)


@torch.no_grad()
def complete(
    model,
    tokenizer,
    prompts: list[str],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 200,
    batch_size: int = 64,
    seed: int = 0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> list[str]:
    """Continue each prompt string (greedy when ``temperature == 0``; else sampled, filtered by ``top_k`` and
    ``top_p`` where set); return the new text only."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature, "top_k": top_k, "top_p": top_p}
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def probe_problems(n_ops: int, count: int, seed: int = 0) -> list[Problem]:
    """``count`` held-out problems (from the test buckets) with exactly ``n_ops`` operations."""
    pool = [p for p in generate_split("test") + generate_split("test_hard") if len(p.ops) == n_ops]
    if len(pool) < count:
        from tandem_rlvr.world.problems import SPLIT_SPECS, generate_problem, in_buckets

        rng = random.Random(seed + 31 * n_ops)
        while len(pool) < count:
            p = generate_problem(rng, n_ops)
            if in_buckets(p, SPLIT_SPECS["test"]["buckets"]):
                pool.append(p)
    return pool[:count]


@dataclass
class ProbeResult:
    """Accuracy and jargon rate of one probe."""

    accuracy: float
    jargon_rate: float
    texts: list[str]


def solo_probe(model, tokenizer, problems: list[Problem], temperature: float = 0.0, seed: int = 0) -> ProbeResult:
    """The model alone on ``problems``: accuracy and share of jargon chains."""
    prompts = [render_prompt(tokenizer, p.text) for p in problems]
    texts = complete(model, tokenizer, prompts, temperature=temperature, seed=seed)
    acc = sum(is_correct(t, p.answer) for t, p in zip(texts, problems)) / len(problems)
    return ProbeResult(acc, sum(map(is_jargon, texts)) / len(texts), texts)


def continuation_probe(
    model, tokenizer, problems: list[Problem], style: str, temperature: float = 0.0, seed: int = 0
) -> float:
    """Accuracy of ``model`` continuing after the gold first step written in ``style`` (plain/jargon)."""
    first = {"plain": plain_steps, "jargon": jargon_steps}[style]
    prefixes = [first(p)[0] for p in problems]
    prompts = [render_prompt(tokenizer, p.text) + pre for p, pre in zip(problems, prefixes)]
    texts = complete(model, tokenizer, prompts, temperature=temperature, seed=seed)
    return sum(is_correct(pre + t, p.answer) for pre, t, p in zip(prefixes, texts, problems)) / len(problems)


def accuracy_by_length(
    model, tokenizer, lengths, count: int = 48, temperature: float = 0.0, seed: int = 0
) -> dict[int, float]:
    """Solo accuracy per chain length on held-out problems."""
    return {n: solo_probe(model, tokenizer, probe_problems(n, count), temperature, seed).accuracy for n in lengths}


def style_breakdown(
    model, tokenizer, lengths, count: int = 32, samples: int = 2, temperature: float = 0.7, seed: int = 0
) -> dict[str, float]:
    """Sampled chains pooled over ``lengths``: jargon rate and accuracy of each style."""
    problems = [p for n in lengths for p in probe_problems(n, count)] * samples
    result = solo_probe(model, tokenizer, problems, temperature, seed)
    flags = [is_jargon(t) for t in result.texts]
    ok = [is_correct(t, p.answer) for t, p in zip(result.texts, problems)]
    n_j = sum(flags)
    return {
        "jargon_rate": n_j / len(flags),
        "accuracy": sum(ok) / len(ok),
        "accuracy_jargon": sum(o for o, f in zip(ok, flags) if f) / n_j if n_j else float("nan"),
        "accuracy_plain": sum(o for o, f in zip(ok, flags) if not f) / (len(flags) - n_j) if n_j < len(flags) else float("nan"),
        "chains": len(flags),
    }


def measure_models(paths, count: int = 48, lengths=(2, 3, 4, 5, 6, 7, 8)) -> dict:
    """The junior's and the senior's measured behaviour: greedy accuracy by length, continuation after a
    plain or a jargon first step, sampled style mix. Single-threaded, so one machine measures the same
    numbers every time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(paths.tokenizer_dir))
    # 3-4 op problems, so that something is left to do after the first (two-op) jargon step
    handoff = [p for n in (3, 4) for p in probe_problems(n, count)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for name, d in (("junior", paths.junior_dir), ("senior", paths.senior_dir)):
            model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
            out[name] = {
                "greedy_accuracy_by_length": accuracy_by_length(model, tok, lengths, count),
                "continue_after_plain_step": continuation_probe(model, tok, handoff, "plain"),
                "continue_after_jargon_step": continuation_probe(model, tok, handoff, "jargon"),
                "sampled_t0.7": style_breakdown(model, tok, lengths, count=max(8, count // 3)),
            }
    finally:
        torch.set_num_threads(threads)
    return out


def world_report(paths, count: int = 48, lengths=(2, 3, 4, 5, 6, 7, 8)) -> dict:
    """Measured facts about a built world: sizes, build time, accuracies by length/style, jargon rate."""
    manifest = paths.manifest
    report: dict = {"build_seconds": manifest["build_seconds"], "vocab_size": manifest["vocab_size"]}
    for name, measured in measure_models(paths, count, lengths).items():
        report[name] = {"parameters": manifest["models"][name]["parameters"],
                        "train_seconds": manifest["models"][name]["train_seconds"], **measured}
    return report
