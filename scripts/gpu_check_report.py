"""gpu_check's report: each arm's JSON summarized, the ratios a reader compares, the printed table
(scripts/gpu_check.py imports it; the bandwidth estimate comes from scripts/cost_model.py)."""

from __future__ import annotations

import json
from pathlib import Path

ARMS = ("trlvr", "grpo")


def arm_path(out: Path, spec: str) -> Path:
    engine, arm = spec.split("/")
    return out / f"arm_{engine}_{arm}.json"


def _tokens(row: dict) -> float:
    return float(sum(row["response_lens"])) if "response_lens" in row else 0.0


def model_shape(model_dir: str) -> dict:
    """What the cost model needs of ``model_dir``'s config.json: parameters, KV bytes a token, sizes."""
    import cost_model

    c = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    c = c.get("text_config", c)
    return {"params": cost_model.params_from_config(c), "hidden": c["hidden_size"], "layers": c["num_hidden_layers"],
            "intermediate": c["intermediate_size"], "vocab": c["vocab_size"],
            "kv_per_token": cost_model.kv_bytes_per_token(cost_model.shape_from_config(c))}


def achieved_bandwidth(row: dict, shape: dict, stacks: int, dtype_bytes: int) -> float:
    """Bytes the cost model says this step's rollout read (every row decoding together) over its time."""
    import cost_model

    moved = cost_model.decode_bytes(row["prompt_lens"], row["response_lens"], shape["params"] * dtype_bytes * stacks,
                                    shape["kv_per_token"] // 2 * dtype_bytes * stacks)
    return moved / max(row["time/rollout_s"], 1e-9)


def summarize(doc: dict, shape: dict | None) -> dict:
    """Means over the timed steps (all but the first, warm-up step, when there are several)."""
    steps = doc["steps"]
    timed = steps[1:] if len(steps) > 1 else steps
    mean = lambda key: sum(r[key] for r in timed) / len(timed)  # noqa: E731
    tokens = sum(_tokens(r) for r in timed)
    cap = doc["args"]["max_new_tokens"]
    lens = [n for r in timed for n in r["response_lens"]]
    out = {"steps": len(steps), "timed_steps": len(timed), "complete": doc["complete"], "stopped": doc.get("stopped"),
           "load_s": doc["load_s"], "step_s": mean("wall_s"), "rollout_s": mean("time/rollout_s"),
           "update_s": mean("time/update_s"), "gen_tokens_per_s": tokens / sum(r["time/rollout_s"] for r in timed),
           "step_tokens_per_s": tokens / sum(r["wall_s"] for r in timed), "response_len": sum(lens) / len(lens),
           "response_len_max": max(lens), "frac_at_cap": sum(n >= cap for n in lens) / len(lens),
           "senior_token_frac": mean("rollout/senior_token_frac"),
           "peak_gpu_gib": max((r.get("peak_gpu_gib") or 0.0) for r in steps) or None, "achieved_bw": None}
    peak = doc["env"].get("peak_bw")
    if shape and doc["env"]["device"] != "cpu":
        dtype_bytes = 4 if doc["args"].get("dtype") == "float32" else 2
        stacks = 2 if doc["arm"] == "trlvr" else 1
        out["achieved_bw"] = sum(achieved_bandwidth(r, shape, stacks, dtype_bytes) for r in timed) / len(timed)
        out["achieved_over_peak_bw"] = out["achieved_bw"] / peak if peak else None
    return out


def ratios(results: dict[str, dict]) -> dict:
    """TRLVR / GRPO per engine, vLLM / in-process per arm, achieved / peak bandwidth per arm."""
    out = {}
    for engine in ("vllm", "hf"):
        t, g = results.get(f"{engine}/trlvr"), results.get(f"{engine}/grpo")
        if t and g:
            out[f"step_time_trlvr_over_grpo/{engine}"] = t["step_s"] / g["step_s"]
            out[f"gen_tokens_per_s_trlvr_over_grpo/{engine}"] = t["gen_tokens_per_s"] / g["gen_tokens_per_s"]
    for arm in ARMS:
        v, h = results.get(f"vllm/{arm}"), results.get(f"hf/{arm}")
        if v and h:
            out[f"gen_tokens_per_s_vllm_over_hf/{arm}"] = v["gen_tokens_per_s"] / h["gen_tokens_per_s"]
    for spec, r in results.items():
        if r.get("achieved_over_peak_bw") is not None:
            out[f"achieved_over_peak_bw/{spec}"] = r["achieved_over_peak_bw"]
    return out


COLS = ("step_s", "rollout_s", "update_s", "gen_tokens_per_s", "response_len", "frac_at_cap", "peak_gpu_gib")


def report(out: Path, specs: list[str], status: dict[str, str], notes: list[str]) -> dict:
    """Read every arm's JSON, print the table and the ratios, return everything as one dict."""
    env = json.loads((out / "env.json").read_text(encoding="utf-8"))
    shape = model_shape(env["model"]) if (Path(env["model"]) / "config.json").exists() else None
    results = {}
    for spec in specs:
        path = arm_path(out, spec)
        doc = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        if doc and doc["steps"]:
            results[spec] = summarize(doc, shape)
    print("\n== gpu_check: " + ", ".join(f"{k}={env[k]}" for k in ("device", "gpu_gib", "torch", "cuda")))
    for n in notes:
        print(n)
    print(f"{'arm':12s}" + "".join(f"{c:>17s}" for c in COLS) + "  status")
    for spec in specs:
        r = results.get(spec)
        cells = "".join(f"{(r[c] if r[c] is not None else float('nan')):17.2f}" for c in COLS) if r else " " * 17 * len(COLS)
        print(f"{spec:12s}{cells}  {status.get(spec, 'not run')}")
    rat = ratios(results)
    for k, v in rat.items():
        print(f"{k}: {v:.2f}")
    for spec, r in results.items():
        if r["achieved_bw"] is not None:
            print(f"{spec}: achieved {r['achieved_bw'] / 1e12:.2f} TB/s (bytes of the cost model over the rollout time)")
    return {"env": env, "notes": notes, "status": status, "arms": results, "ratios": rat}
