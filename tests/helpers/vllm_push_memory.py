"""One process of the push-memory measurement (tests/engines/test_vllm_multiprocess.py): ``python vllm_push_memory.py
SENIOR JUNIOR FSDP OUT`` with RANK / WORLD_SIZE / MASTER_* set.

Loads the senior in float32, shards it (``FSDP``: full, zero2 or off), starts this process's dual vLLM engine
(float32, external_launcher), changes every weight, then measures the process's peak resident memory during
one push of the senior into the engine: the kernel's high-water mark (VmHWM) is reset just before the push
(``/proc/self/clear_refs``) and read after it. Writes ``OUT/rank{R}.json``.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _status(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def main(senior: str, junior: str, mode: str, out: str) -> None:
    from transformers import AutoModelForCausalLM

    from tandem_rlvr.engines import vllm_backend as vb
    from tandem_rlvr.engines.vllm_dual import DualVLLMEngine, make_dual_llm
    from tandem_rlvr.engines.weights import fsdp_units
    from tandem_rlvr.training import fsdp

    dist.init_process_group("gloo")
    model = AutoModelForCausalLM.from_pretrained(senior, dtype=torch.float32)
    full_bytes = sum(p.numel() * 4 for p in model.parameters())
    if mode != "off":
        fsdp.shard(model, mode)
    units = fsdp_units(model) if mode != "off" else []
    unit_bytes = max((sum(u.get_parameter(n).numel() * 4 for n in names) for _, u, names in units), default=0)
    llm = make_dual_llm(senior, junior, make=lambda p, **k: vb.make_llm(p, **k, kv_cache_memory_bytes=2**26,
                                                                         enforce_eager=True),
                        dtype="float32", max_model_len=128, distributed_executor_backend="external_launcher")
    engine = DualVLLMEngine(llm, eos_token_ids=[0], pad_token_id=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    engine.sync_senior(model)
    peak = _status("VmHWM")
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(
        {"before": before, "peak": peak, "full_fp32": full_bytes, "largest_unit": unit_bytes, "mode": mode}))
    dist.barrier()
    os._exit(0)  # the engine's threads need no orderly shutdown here


if __name__ == "__main__":
    main(*sys.argv[1:5])
