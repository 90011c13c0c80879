"""model.gradient_checkpointing: the senior's decoder layers recompute their forward in the backward, with the
same gradients as without; the junior and the rollouts (eval mode) are untouched."""

import copy

import pytest
import torch

from helpers.tiny_models import make_tiny_model


def _forward_counts(model):
    """A counter of each decoder layer's forward calls (a checkpointed layer runs twice per forward+backward)."""
    counts = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda *_a, i=i: counts.__setitem__(i, counts[i] + 1))
    return counts


def _grads(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, use_cache=False).logits
    torch.log_softmax(logits.float(), -1)[..., 5].sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _assert_same_grads(got, want):
    assert got.keys() == want.keys() and want
    for n, g in want.items():
        scale = float(g.abs().max()) or 1.0  # tolerances scaled to each gradient's magnitude
        torch.testing.assert_close(got[n], g, rtol=1e-5, atol=1e-5 * scale, msg=n)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointed_senior_has_the_same_gradients_and_recomputes_each_layer(lora):
    from tandem_rlvr.models import enable_gradient_checkpointing

    base = make_tiny_model(64, 0, hidden=32, layers=2)
    if lora:
        from peft import LoraConfig, get_peft_model

        base = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                               lora_dropout=0.0, task_type="CAUSAL_LM"))
        for n, p in base.named_parameters():  # a nonzero adapter (peft starts B at 0)
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    ids = torch.randint(1, 64, (3, 11), generator=torch.Generator().manual_seed(0))
    plain, ckpt = base, copy.deepcopy(base)
    want = _grads(plain, ids)
    enable_gradient_checkpointing(ckpt)
    hf = ckpt.get_base_model() if lora else ckpt
    assert all(layer.gradient_checkpointing for layer in hf.model.layers)
    counts = _forward_counts(hf)
    got = _grads(ckpt, ids)
    assert counts == [2] * len(counts), "each layer ran its forward again in the backward (recompute)"
    _assert_same_grads(got, want)
    if lora:
        assert any("lora_" in n for n in got) and not any("embed_tokens" in n for n in got)
    # eval mode (rollouts, validation): no recompute, the KV cache is kept
    counts[:] = [0] * len(counts)
    ckpt.eval()
    with torch.no_grad():
        out = ckpt(input_ids=ids, use_cache=True)
    assert out.past_key_values is not None and counts == [1] * len(counts)


def _one_step(tmp_path, tokenizer, senior, junior, checkpointing: bool):
    from types import SimpleNamespace

    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.trainer import make_trainer

    examples = [SimpleNamespace(id=str(i), problem=f"What is {i} plus 1?", answer=str(i + 1)) for i in range(4)]
    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused", "train.steps=1",
                             "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=4",
                             "rollout.max_new_tokens=10", f"train.out_dir={tmp_path}", "algo.lr=1e-2",
                             "train.save_every=0", "train.progress=false"])
    # set on the loaded config's instance: build.py reads getattr(cfg.model, "gradient_checkpointing", False),
    # so this test runs before and after config.py declares the key
    cfg.model.gradient_checkpointing = checkpointing
    pair = Pair(copy.deepcopy(senior), copy.deepcopy(junior), tokenizer)
    tr = make_trainer(cfg, pair=pair, reward_fn=lambda c, g: float(len(c) % 3 == 0), examples=examples)
    flags = ([layer.gradient_checkpointing for layer in pair.senior.model.layers],
             [layer.gradient_checkpointing for layer in pair.junior.model.layers])
    return tr.train_step(0), flags


def test_the_config_key_checkpoints_the_senior_only_and_leaves_the_step_unchanged(tmp_path, tokenizer):
    from tandem_rlvr.models import freeze

    senior, junior = make_tiny_model(len(tokenizer), 0, 32), freeze(make_tiny_model(len(tokenizer), 1, 32))
    off, (s_off, _) = _one_step(tmp_path / "off", tokenizer, senior, junior, False)
    on, (s_on, j_on) = _one_step(tmp_path / "on", tokenizer, senior, junior, True)
    assert not any(s_off) and all(s_on) and not any(j_on), "the senior's layers only"
    assert abs(off["train/loss"]) > 1e-5
    assert on["rollout/response_len"] == off["rollout/response_len"], "the same rollouts (eval mode, KV cache)"
    assert on["train/loss"] == pytest.approx(off["train/loss"], rel=1e-5, abs=1e-7)
    assert on["train/grad_norm"] == pytest.approx(off["train/grad_norm"], rel=1e-5)


ENTRY = '''
import json, sys
from pathlib import Path
import torch.distributed as dist
from tandem_rlvr.config import load_config
from tandem_rlvr.training.trainer import make_trainer
cfg = load_config(sys.argv[1])
cfg.model.gradient_checkpointing = sys.argv[2] == "1"  # set on the instance: works before config.py declares it
tr = make_trainer(cfg)
tr.train()
inner = getattr(tr.senior, "module", tr.senior)
flags = [bool(layer.gradient_checkpointing) for layer in inner.model.layers]
rank = dist.get_rank() if dist.is_initialized() else 0
(Path(cfg.train.out_dir).parent / f"flags{rank}.json").write_text(json.dumps(flags))
if dist.is_initialized():
    dist.destroy_process_group()
'''


def _fsdp_run(tmp_path, model_dirs, name, checkpointing):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from helpers.paths import TESTS
    from helpers.run_files import write_config

    d = tmp_path / name
    d.mkdir()
    cfg = write_config(d, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=2,
                       save_every=0, fsdp="full")
    c = yaml.safe_load(cfg.read_text())
    c["algo"].update(loss_type="dapo", micro_batch=4)
    c["rollout"]["batch_size"] = 4
    cfg.write_text(yaml.safe_dump(c))
    (d / "entry.py").write_text(ENTRY)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", "29547", str(d / "entry.py"), str(cfg),
           "1" if checkpointing else "0"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return d


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_checkpointing_under_fsdp_full_gives_the_same_run(tmp_path, model_dirs):
    """FSDP2 over two gloo processes: the recompute in the backward re-gathers each layer (FSDP2's pre-backward
    hook); metrics and final weights equal the run without checkpointing."""
    import json

    from safetensors.torch import load_file

    from helpers.processes import APPROX

    off = _fsdp_run(tmp_path, model_dirs, "off", False)
    on = _fsdp_run(tmp_path, model_dirs, "on", True)
    for rank in (0, 1):
        assert not any(json.loads((off / f"flags{rank}.json").read_text()))
        assert all(json.loads((on / f"flags{rank}.json").read_text()))
    rows = [[json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()] for d in (off, on)]
    assert len(rows[0]) == len(rows[1]) == 2
    for a, b in zip(*rows):
        for k, v in a.items():
            if not k.startswith(("time/", "dist/")):
                assert b[k] == pytest.approx(v, abs=1e-3 if k in APPROX else 1e-6), k
    wa, wb = (load_file(str(d / "run" / "final" / "model.safetensors")) for d in (off, on))
    assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-6
