"""The predicted GPU step time of the paper's run (docs/scale-out.md), as an interval, from published hardware
figures and the CPU measurements. A prediction, not a measurement: no GPU has run this project.

    python scripts/cost_model.py                 # two A100 80 GB (the authors' hardware), the paper configs
    python scripts/cost_model.py --gpu h100-sxm  # another card

The terms: the rollout (vLLM decode, bandwidth-bound: both stacks' weights and every live row's KV read once
per decode step, the sampler over 2V+1 logits, a host cost per step), simulated step by step with the rows that
fit the KV cache running together and the others waiting (waves); the old, junior and update forwards (compute
at a fraction of the bf16 peak); FSDP collectives and the engine's sleep, wake and push. Each input is a range
(achievable, not peak, bandwidth; the response-length distribution up to the cap; the host cost), and the
interval is the optimistic end of every range against the pessimistic end of every range.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """What the cost model needs of a decoder: parameters, KV layout, vocabulary."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int


QWEN3_4B = Shape(params=4.02e9, layers=36, kv_heads=8, head_dim=128, vocab=151936)
QWEN3_4B_HIDDEN, QWEN3_4B_INTERMEDIATE = 2560, 9728


def shape_from_config(c: dict) -> Shape:
    """The :class:`Shape` of a transformers config.json (its text config)."""
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return Shape(params_from_config(c), c["num_hidden_layers"], c.get("num_key_value_heads") or heads, head_dim,
                 c["vocab_size"])


def params_from_config(c: dict) -> float:
    """Parameters of a Llama/Qwen-style decoder from its config.json: embeddings (and an untied head), per layer
    the q, k, v, o projections, the three SwiGLU matrices and the norms."""
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    d = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    per_layer = 2 * h * heads * d + 2 * h * kv * d + 3 * h * inter + 2 * h + 2 * d
    head = 0 if c.get("tie_word_embeddings", True) else vocab * h
    return float(vocab * h + head + layers * per_layer + h)


@dataclass(frozen=True)
class Gpu:
    """Published peak figures (datasheets): HBM bandwidth in bytes/s, dense bf16 FLOP/s, memory in bytes."""

    name: str
    bandwidth: float
    bf16_flops: float
    memory: float


GPUS = {
    "a100-80gb": Gpu("A100 80 GB SXM", 2.039e12, 312e12, 80 * GIB),
    "h100-sxm": Gpu("H100 80 GB SXM", 3.35e12, 989e12, 80 * GIB),
    "h100-pcie": Gpu("H100 80 GB PCIe", 2.0e12, 756e12, 80 * GIB),
    "h200": Gpu("H200 141 GB", 4.8e12, 989e12, 141 * GB),
}


def kv_bytes_per_token(shape: Shape, stacks: int = 1, dtype_bytes: int = 2) -> int:
    """Keys and values of one token in every layer, for ``stacks`` models (the dual engine holds 2)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes * stacks


def weight_bytes(shape: Shape, stacks: int = 1, dtype_bytes: int = 2) -> float:
    return shape.params * dtype_bytes * stacks


def sampler_width(shape: Shape, dual: bool) -> int:
    """Logit columns the engine samples from: V, or 2V + 1 on the dual engine (both vocabularies and the
    stop sentinel)."""
    return 2 * shape.vocab + 1 if dual else shape.vocab


def kv_cache_bytes(gpu_memory: float, vllm_memory: float, weights: float, other: float) -> float:
    """What vLLM keeps for the KV cache: its share of the device, less the weights and its activations and
    CUDA graphs (``other``)."""
    return vllm_memory * gpu_memory - weights - other


def rows_that_fit(cache_bytes: float, kv_per_token: float, row_tokens: int) -> int:
    """Rows of ``row_tokens`` tokens (prompt + response) the cache holds at once."""
    return int(cache_bytes // (kv_per_token * row_tokens))


def waves(rows: int, fit: int) -> int:
    return math.ceil(rows / max(fit, 1))


def response_lengths(rows: int, cap: int, cap_frac: float, lo: int, hi: int) -> list[int]:
    """A deterministic length distribution: ``round(cap_frac * rows)`` rows at the cap, the others evenly
    spread over [lo, hi] (sorted as they would be admitted: no order is assumed; the simulation takes them
    in this order)."""
    at_cap = round(cap_frac * rows)
    n = rows - at_cap
    rest = [round(lo + (hi - lo) * (i + 0.5) / n) for i in range(n)] if n else []
    out = [cap] * at_cap + rest
    return [min(x, cap) for x in out]


@dataclass(frozen=True)
class Decode:
    """The rollout's decode costs per step: bytes over the achievable bandwidth, plus a host cost."""

    weights: float  # bytes of every stack's weights (read once per decode step)
    kv_per_token: float  # bytes per context token, every stack
    sampler: float  # bytes per row per step of the sampler (width x 4 B x passes)
    bw_weights: float  # achievable bandwidth (bytes/s) of weight reads
    bw_kv: float  # achievable bandwidth of KV reads (paged, less regular)
    host_s: float  # scheduler + logits processor per decode step


def simulate_rollout(prompt: int, lengths: list[int], capacity_tokens: int, d: Decode) -> dict:
    """Decode ``lengths`` rows (each ``prompt`` tokens of prompt) step by step. A row is admitted when its whole
    final context fits next to the rows running (the cache holds ``capacity_tokens``); all running rows
    advance one token a step and read their context. Returns seconds, decode steps, and how many rows ran at
    once at most."""
    pending = list(lengths)
    running: list[list[int]] = []  # [tokens generated, final length]
    reserved = seconds = 0.0
    steps = peak = 0
    while pending or running:
        while pending and reserved + prompt + pending[0] <= capacity_tokens:
            n = pending.pop(0)
            running.append([0, n])
            reserved += prompt + n
        if not running:
            raise ValueError(f"a row of {prompt} + {pending[0]} tokens does not fit {capacity_tokens} tokens of KV cache")
        peak = max(peak, len(running))
        context = sum(prompt + done for done, _ in running)
        seconds += (d.weights + len(running) * d.sampler) / d.bw_weights + context * d.kv_per_token / d.bw_kv + d.host_s
        steps += 1
        for r in running:
            r[0] += 1
        finished = [r for r in running if r[0] >= r[1]]
        running = [r for r in running if r[0] < r[1]]
        reserved -= sum(prompt + n for _, n in finished)
    return {"seconds": seconds, "steps": steps, "peak_rows": peak}


def at(pair: tuple, t: float):
    """The point ``t`` of the way from ``pair[0]`` (optimistic, t = 0) to ``pair[1]`` (pessimistic, t = 1)."""
    a, b = pair
    if isinstance(a, tuple):
        return tuple(at((x, y), t) for x, y in zip(a, b))
    return a + (b - a) * t


@dataclass(frozen=True)
class Ends:
    """The two ends of every ranged input: ``[0]`` optimistic, ``[1]`` pessimistic (``t`` in between)."""

    bw_weights_frac: tuple = (0.85, 0.70)  # of peak HBM bandwidth, coalesced weight reads
    bw_kv_frac: tuple = (0.70, 0.45)  # paged KV reads
    cap_frac: tuple = (0.1, 0.8)  # responses at the 3,000-token cap
    spread: tuple = ((300, 2700), (1000, 3000))  # the other responses, evenly over this range
    host_ms: tuple = (3.0, 6.0)  # vLLM's V1 engine core per decode step (CPU-build figure; GPU unmeasured)
    proc_ms: tuple = (1.7, 3.5)  # the tandem logits processor per step (1.7 ms measured on the CPU, B = 64)
    mfu: tuple = (0.45, 0.30)  # trainer forwards/backwards, of the dense bf16 peak
    sampler_passes: tuple = (4, 8)  # fp32 passes over the logits (processor, temperature, softmax, sample)
    other_s: tuple = (5.0, 10.0)  # FSDP collectives not hidden + sleep, wake and push
    vllm_other: tuple = (2 * GIB, 3 * GIB)  # vLLM's activations and CUDA graphs beside weights and KV


def rollout_seconds(gpu: Gpu, shape: Shape, *, dual: bool, t: float, rows: int = 64, prompt: int = 200,
                    cap: int = 3000, vllm_memory: float = 0.5, e: Ends = Ends()) -> dict:
    """One GPU's rollout of ``rows`` rows at the point ``t`` of the ranges (0 optimistic, 1 pessimistic)."""
    stacks = 2 if dual else 1
    weights, kv = weight_bytes(shape, stacks), kv_bytes_per_token(shape, stacks)
    cache = kv_cache_bytes(gpu.memory, vllm_memory, weights, at(e.vllm_other, t))
    lo, hi = at(e.spread, t)
    lengths = response_lengths(rows, cap, at(e.cap_frac, t), lo, hi)
    host = (at(e.host_ms, t) + (at(e.proc_ms, t) if dual else 0.0)) / 1e3
    d = Decode(weights, kv, sampler_width(shape, dual) * 4 * at(e.sampler_passes, t),
               gpu.bandwidth * at(e.bw_weights_frac, t), gpu.bandwidth * at(e.bw_kv_frac, t), host)
    out = simulate_rollout(prompt, lengths, int(cache // kv), d)
    prefill = 2 * shape.params * stacks * prompt * rows / (gpu.bf16_flops * at(e.mfu, t))
    fit = rows_that_fit(cache, kv, prompt + cap)
    return {**out, "seconds": out["seconds"] + prefill, "cache_gb": cache / GB, "fit_at_cap": fit,
            "waves_at_cap": waves(rows, fit), "mean_len": sum(lengths) / rows}


def step_seconds(gpu: Gpu, shape: Shape, *, arm: str, t: float, rows: int = 64, prompt: int = 200,
                 checkpointing: bool = True, e: Ends = Ends()) -> dict:
    """One step of the paper's run on one of two GPUs: rollout, old (and junior) log-probs, the update,
    the rest; ``arm`` trlvr (dual engine, junior log-probs) or grpo."""
    dual = arm == "trlvr"
    ro = rollout_seconds(gpu, shape, dual=dual, t=t, rows=rows, prompt=prompt, e=e)
    tokens = rows * (prompt + ro["mean_len"])
    flops = gpu.bf16_flops * at(e.mfu, t)
    fwd = 2 * shape.params * tokens / flops
    update = (8 if checkpointing else 6) * shape.params * tokens / flops  # a recompute adds one forward
    parts = {"rollout": ro["seconds"], "old_logps": fwd, "junior_logps": fwd if dual else 0.0, "update": update,
             "other": at(e.other_s, t)}
    return {"parts": parts, "seconds": sum(parts.values()), "rollout": ro}


def validation_seconds(gpu: Gpu, shape: Shape, *, t: float, problems: int = 1000, n: int = 4, gpus: int = 2,
                       every: int = 20, prompt: int = 200, e: Ends = Ends()) -> float:
    """Validation amortized over ``every`` steps: ``problems x n`` solo chains shared by ``gpus``."""
    rows = problems * n // gpus
    return rollout_seconds(gpu, shape, dual=False, t=t, rows=rows, prompt=prompt, e=e)["seconds"] / every


def interval(gpu: Gpu, shape: Shape = QWEN3_4B, e: Ends = Ends(), points=(0.0, 0.5, 1.0)) -> dict:
    """``{arm: ...}`` step seconds at the optimistic end, the middle and the pessimistic end of every range,
    with and without the amortized validation."""
    out = {}
    for arm in ("trlvr", "grpo"):
        steps = [step_seconds(gpu, shape, arm=arm, t=t, e=e) for t in points]
        val = [validation_seconds(gpu, shape, t=t, e=e) for t in points]
        out[arm] = {"steps": steps, "step_s": tuple(s["seconds"] for s in steps),
                    "with_val_s": tuple(s["seconds"] + v for s, v in zip(steps, val))}
    return out


def decode_bytes(prompt_lens: list[int], response_lens: list[int], weights: float, kv_per_token: float) -> float:
    """Bytes a rollout whose rows all decode together reads: the weights once per decode step (as many steps as
    the longest response) and each row's context once per step it decodes (``L * p + L * (L - 1) / 2`` tokens
    for a row of prompt ``p`` and response ``L``). gpu_check divides it by the measured rollout time."""
    steps = max(response_lens, default=0)
    context = sum(L * p + L * (L - 1) / 2 for p, L in zip(prompt_lens, response_lens))
    return steps * weights + context * kv_per_token


def activation_bytes_per_token(shape_hidden: int, intermediate: int, layers: int, checkpointing: bool) -> float:
    """Activations the backward keeps per token (16-bit): ~34 h bytes per layer (Korthikanti et al. 2022, attention
    by SDPA without the s^2 term) plus 4 I for SwiGLU's gate and up outputs; with checkpointing, each layer's
    input (2 h) plus one layer's full set during its recompute."""
    per_layer = 34 * shape_hidden + 4 * intermediate
    return (2 * shape_hidden * layers + per_layer) if checkpointing else per_layer * layers


def trainer_memory(params: float, *, hidden: int, intermediate: int, layers: int, vocab: int, micro: int,
                   row_tokens: int, response_tokens: int, checkpointing: bool, junior: bool = True,
                   vllm_bytes: float = 0.0, weight_bytes: int = 4, junior_bytes: int = 2) -> dict:
    """Bytes one unsharded trainer holds (gpu_check's runs): the trained weights, their gradients and AdamW's two
    states, all in the weights' dtype (``weight_bytes``: 4 for float32 master weights under bf16 compute), the frozen
    junior (``junior_bytes``: bf16), then during the update one micro-batch's activations and its logits (bf16
    logits, fp32 log-softmax and its gradient: 10 B each); during the rollout the engine's ``vllm_bytes`` instead
    (the gradients of the last update are still held: ``zero_grad`` frees them at the next update). AdamW is fused
    on CUDA: no step-time copy of its states."""
    static = params * (4 * weight_bytes + (junior_bytes if junior else 0))
    acts = micro * row_tokens * activation_bytes_per_token(hidden, intermediate, layers, checkpointing)
    logits = micro * (response_tokens + 1) * vocab * 10
    return {"update": static + acts + logits, "rollout": static + vllm_bytes, "static": static,
            "activations": acts, "logits": logits}


AUTHORS_TRLVR_STEP_S = 4.7 * 60  # 9.4 h to step 120 on two A100s (the paper)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", default="a100-80gb", choices=sorted(GPUS))
    args = p.parse_args(argv)
    gpu = GPUS[args.gpu]
    res = interval(gpu)
    print(f"PREDICTED (not measured) for two {gpu.name}, Qwen3-4B self-paired, 64 rollouts per GPU, "
          f"3,000-token cap; each figure: optimistic / middle / pessimistic end of every range")
    a = AUTHORS_TRLVR_STEP_S
    for arm, r in res.items():
        lo, mid, hi = r["steps"]
        print(f"{arm}: rollout {lo['parts']['rollout']:.0f} / {mid['parts']['rollout']:.0f} / {hi['parts']['rollout']:.0f} s "
              f"({lo['rollout']['steps']} / {mid['rollout']['steps']} / {hi['rollout']['steps']} decode steps, at most "
              f"{lo['rollout']['peak_rows']} / {mid['rollout']['peak_rows']} / {hi['rollout']['peak_rows']} rows at once; "
              f"{hi['rollout']['fit_at_cap']} rows of 3,200 tokens fit the {hi['rollout']['cache_gb']:.1f} GB cache: "
              f"{hi['rollout']['waves_at_cap']} waves at the cap)")
        print("  " + ", ".join(f"{k} {lo['parts'][k]:.0f} / {mid['parts'][k]:.0f} / {hi['parts'][k]:.0f} s" for k in lo["parts"]))
        s, v = r["step_s"], r["with_val_s"]
        print(f"  step {' / '.join(f'{x:.0f}' for x in s)} s, with validation {' / '.join(f'{x:.0f}' for x in v)} s; "
              f"x the authors' TRLVR step: {' / '.join(f'{x / a:.2f}' for x in s)} "
              f"({' / '.join(f'{x / a:.2f}' for x in v)} with validation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
