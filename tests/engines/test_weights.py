"""What a rollout engine loads (tandem_rlvr.engines.weights): an FSDP2-sharded senior streamed one unit at a time
gives the full model's tensors under its names, cast to the engine's dtype, in two gloo processes; a plain model
its parameters (LoRA merging: tests/engines/test_vllm.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import make_tiny_model

from tandem_rlvr.engines.weights import engine_weights

SCRIPT = r'''
import json, sys, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from tandem_rlvr.engines.weights import engine_weights, fsdp_units
from tandem_rlvr.training import fsdp

dist.init_process_group("gloo")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ref = {n: p.detach().clone() for n, p in model.named_parameters()}
fsdp.shard(model, sys.argv[2])
units = [(prefix, names) for prefix, _, names in fsdp_units(model)]
order, diff, dtypes = [], 0.0, set()
with engine_weights(model, torch.bfloat16) as weights:
    for name, t in weights:
        order.append(name)
        dtypes.add(str(t.dtype))
        diff = max(diff, float((t.float() - ref[name].to(torch.bfloat16).float()).abs().max()))
        assert t.shape == ref[name].shape, name
still_sharded = all(type(p).__name__ == "DTensor" for p in model.parameters())
if dist.get_rank() == 0:
    json.dump({"order": order, "ref": list(ref), "diff": diff, "dtypes": sorted(dtypes), "units": units,
               "sharded": still_sharded}, open(sys.argv[3], "w"))
dist.barrier()
dist.destroy_process_group()  # not left to interpreter exit, where a live gloo group can abort a rank
'''


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("mode", ["full", pytest.param("zero2", marks=pytest.mark.slow)])  # zero2: slow suite (cost)
def test_a_sharded_senior_streams_unit_by_unit_to_the_full_weights(tmp_path, tokenizer, mode):
    import os
    import socket

    make_tiny_model(len(tokenizer), 0, 32, layers=3).save_pretrained(str(tmp_path / "m"))
    (tmp_path / "run.py").write_text(SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONFAULTHANDLER="1")
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "m"), mode,
                                       str(tmp_path / "out.json")], env=env, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=300)[1] for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], "\n".join(f"rank {r} exited {c}:\n{e[-2000:]}" for r, (c, e) in enumerate(zip(codes, errs)))
    out = json.loads((tmp_path / "out.json").read_text())
    assert sorted(out["order"]) == sorted(out["ref"]) and len(out["order"]) == len(out["ref"])
    assert out["diff"] == 0.0 and out["dtypes"] == ["torch.bfloat16"]
    assert out["sharded"], "every unit is resharded after it was streamed"
    prefixes = [p for p, _ in out["units"]]
    assert prefixes == ["", "model.layers.0.", "model.layers.1.", "model.layers.2."]  # the root's own first
    assert set(out["units"][0][1]) == {n for n in out["ref"] if not n.startswith("model.layers.")}
    assert "model.embed_tokens.weight" in out["units"][0][1]
    streamed = [n for p, names in out["units"] for n in (p + x for x in names)]
    assert streamed == out["order"], "each unit's tensors come together, in unit order"


def test_a_plain_model_yields_its_parameters_cast_only_where_asked(tokenizer):
    model = make_tiny_model(len(tokenizer), 0, 32)
    with engine_weights(model) as weights:
        same = dict(weights)
    assert all(same[n] is not None and same[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())
    with engine_weights(model, torch.float16) as weights:
        half = dict(weights)
    assert {t.dtype for t in half.values()} == {torch.float16} and list(half) == list(same)


def test_safetensors_files_are_the_ones_transformers_reads(tmp_path):
    """The dual engine reads the junior's files itself: the index's shards, else model.safetensors, else every
    *.safetensors; never a second copy beside them (a repo's consolidated.safetensors), never silently nothing."""
    from safetensors.torch import save_file

    from tandem_rlvr.engines.weights import INDEX, safetensors_files

    t = {"w": torch.zeros(2)}
    d = tmp_path / "sharded"
    d.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "consolidated.safetensors"):
        save_file(t, str(d / name))
    (d / INDEX).write_text(json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors",
                                                     "b": "model-00001-of-00002.safetensors",
                                                     "c": "model-00001-of-00002.safetensors"}}))
    assert [p.name for p in safetensors_files(d)] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="names 'model-00002-of-00002.safetensors', which is not there"):
        safetensors_files(d, "tandem junior")
    (d / INDEX).write_text("{")
    with pytest.raises(FileNotFoundError, match="unreadable model.safetensors.index.json"):
        safetensors_files(d)
    one = tmp_path / "one"
    one.mkdir()
    save_file(t, str(one / "model.safetensors"))
    save_file(t, str(one / "consolidated.safetensors"))
    assert [p.name for p in safetensors_files(one)] == ["model.safetensors"]
    (one / "model.safetensors").unlink()
    assert [p.name for p in safetensors_files(one)] == ["consolidated.safetensors"]  # the only weights there
    with pytest.raises(FileNotFoundError, match="tandem junior '.*empty' has no \\*.safetensors weights"):
        safetensors_files(tmp_path / "empty", "tandem junior")
