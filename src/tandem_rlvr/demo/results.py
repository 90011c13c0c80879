"""Reading the demo's ``results.json`` dict: its runs in report order, their labels and metric values."""

from __future__ import annotations


def runs(results: dict) -> list[str]:
    """The trained runs of ``results`` in report order: grpo, trlvr, then kl_reg by increasing β."""
    names = list(results["arms"])
    return sorted(names, key=lambda n: ({"grpo": 0, "trlvr": 1}.get(n.split("@")[0], 2), _beta(n)))


def kl_runs(results: dict) -> list[str]:
    return [n for n in runs(results) if n.split("@")[0] == "kl_reg" and results["arms"][n]]


def _beta(name: str) -> float:
    return float(name.split("@")[1]) if "@" in name else 0.0


def label(name: str) -> str:
    """A run name for people: ``kl_reg β=0.1``."""
    return f"kl_reg β={name.split('@')[1]}" if "@" in name else name


def arm_values(results: dict, run: str, key: str) -> list[float]:
    return [metric_of(m, key) for m in results["arms"][run].values()]


def metric_of(metrics: dict, key: str) -> float:
    if key.startswith("curve:"):
        return float(metrics.get("curve", {}).get(key[6:], float("nan")))
    v = metrics.get(key, float("nan"))
    return float(v) if v is not None else float("nan")
