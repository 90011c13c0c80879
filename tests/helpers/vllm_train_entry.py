"""``tandem-rlvr`` with small eager vLLM engines, for the multi-process vLLM tests (tests/engines/test_vllm_multiprocess.py).

Run as ``python tests/helpers/vllm_train_entry.py train CONFIG [overrides]`` (one process, or one per rank with
RANK / WORLD_SIZE / MASTER_* set). Differences from the real command, all outside the package:

- every vLLM engine gets a 128 MiB KV cache and eager mode (CPU memory and start-up time);
- ``TANDEM_TEST_MARKS=DIR``: each engine call (``generate_many``: a step's rollout) first creates
  ``DIR/rank{R}-{n}`` (a test signals a process while a rollout is under way);
- ``TANDEM_TEST_CHECK=DIR``: after training, this process writes ``DIR/rank{R}.json`` comparing its
  engine with the trained senior (:func:`engine_matches`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from tandem_rlvr.engines import vllm_backend as vb
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine, _model
from tandem_rlvr.training import trainer as trainer_mod

RANK = int(os.environ.get("RANK", "0"))
_real_make = vb.make_llm
vb.make_llm = lambda path, **kw: _real_make(path, **{**kw, "kv_cache_memory_bytes": 2**27, "enforce_eager": True})


def _marking(generate):
    count = [0]

    def wrapped(self, *a, **kw):
        marks = os.environ.get("TANDEM_TEST_MARKS")
        if marks:
            count[0] += 1
            Path(marks, f"rank{RANK}-{count[0]}").touch()
        return generate(self, *a, **kw)

    return wrapped


def engine_matches(tr) -> dict:
    """The engine's senior stack against the trained senior's final weights: every parameter vLLM keeps in
    checkpoint layout (embeddings, norms, fused q/k/v biases, head) compared exactly, and greedy decoding of
    the training prompts on the engine against the in-process senior (the packed linear weights)."""
    from transformers import AutoModelForCausalLM

    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.engines.rollout import generate
    from tandem_rlvr.engines.types import Sampling

    final = AutoModelForCausalLM.from_pretrained(str(tr.run_dir / "final"), dtype=torch.float32).eval()
    ref = dict(final.named_parameters())
    for i, layer in enumerate(final.model.layers):
        att = layer.self_attn
        ref[f"model.layers.{i}.self_attn.qkv_proj.bias"] = torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias])
    kept = {n: p for n, p in _model(tr.engine.llm)[1].senior.named_parameters() if p.numel()}
    diffs = {n: float((p.detach().cpu() - ref[n].detach()).abs().max()) for n, p in kept.items()}
    start = dict(AutoModelForCausalLM.from_pretrained(str(tr.cfg.model.senior), dtype=torch.float32).named_parameters())
    moved = max(float((ref[n] - start[n]).abs().max()) for n in start)
    pb = PromptBatch.left_padded(tr.prompts, tr.tok.pad_token_id)
    greedy = Sampling(max_new_tokens=tr.cfg.rollout.max_new_tokens, temperature=0)
    got = tr.engine.generate(pb, make_schedule("none"), greedy)
    want = generate(final, None, pb.ids_BP, pb.mask_BP, make_schedule("none"), greedy, eos_token_ids=tr.eos,
                    pad_token_id=tr.tok.pad_token_id)
    return {"kept": sorted(kept), "max_diff": max(diffs.values()), "moved": moved,
            "greedy_equal": bool(torch.equal(got.response_ids_BT, want.response_ids_BT)),
            "engine": type(tr.engine).__name__}


def _checking(train):
    def wrapped(self):
        out = train(self)
        check = os.environ.get("TANDEM_TEST_CHECK")
        if check:
            self.acc.wait_for_everyone()  # final/ is written by the main process
            with torch.no_grad():
                Path(check, f"rank{RANK}.json").write_text(json.dumps(engine_matches(self)))
        return out

    return wrapped


DualVLLMEngine.generate_many = _marking(DualVLLMEngine.generate_many)
trainer_mod.Trainer.train = _checking(trainer_mod.Trainer.train)

if __name__ == "__main__":
    from tandem_rlvr.cli import main

    sys.exit(main(sys.argv[1:]))
