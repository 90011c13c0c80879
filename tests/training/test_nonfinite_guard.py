"""The non-finite guard: a NaN/inf loss or gradient skips the update (weights and optimiser state
unchanged), is logged as ``train/nonfinite_run``, and ``train.max_nonfinite`` in a row stop the run
with a checkpoint and a clear :class:`TandemError`; the stopped run resumes from that checkpoint."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers.tiny_models import make_tiny_model
from safetensors.torch import load_file

from tandem_rlvr.training import core
from tandem_rlvr.config import load_config
from tandem_rlvr.data import Example
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.training.trainer import TandemError, make_trainer

# a skipped update means the LR scheduler steps without an optimizer step, which torch warns about
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")

EXAMPLES = [Example(str(i), f"What is {i} plus 1?", str(i + 1)) for i in range(8)]


def length_reward(completion: str, gold: str) -> float:
    return float(len(completion) % 3 == 0)


@pytest.fixture(scope="module")
def base_models(tokenizer):
    return make_tiny_model(len(tokenizer), 0, 32), freeze(make_tiny_model(len(tokenizer), 1, 32))


def _cfg(tmp_path, *extra):
    # one prompt group per mini-batch and prompts_per_step == mini_batch_prompts: one update per step
    return load_config(None, [
        "algo.arm=grpo", "model.senior=unused", "model.junior=unused", "train.steps=2", "train.prompts_per_step=2",
        "algo.group_size=2", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=6", "algo.lr=1e-2",
        f"train.out_dir={tmp_path / 'run'}", "train.save_every=0", "train.progress=false", *extra])


def _trainer(cfg, tokenizer, base_models):
    s, j = base_models
    return make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                   examples=EXAMPLES)


def _weights(tr):
    return {k: v.detach().clone() for k, v in tr.pair.senior.state_dict().items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def _rows(tmp_path):
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])  # with clipping and with clipping off
def test_nan_loss_skips_the_update_and_is_logged(tmp_path, tokenizer, base_models, monkeypatch, max_grad_norm):
    poison_policy_loss(monkeypatch, calls=None)
    tr = _trainer(_cfg(tmp_path, f"algo.max_grad_norm={max_grad_norm}"), tokenizer, base_models)
    before = _weights(tr)
    tr.train()  # 2 non-finite updates < max_nonfinite=3: the run ends normally
    assert _same(before, _weights(tr))
    assert not tr.opt.state  # AdamW never stepped: no moment estimates were polluted
    rows = _rows(tmp_path)
    assert [r["train/nonfinite_run"] for r in rows] == [1, 2]
    assert all(r["train/grad_norm"] is None for r in rows)  # NaN logged as null (strict JSON), not hidden


def test_one_poisoned_batch_is_skipped_and_training_goes_on(tmp_path, tokenizer, base_models, monkeypatch):
    poison_policy_loss(monkeypatch, calls={0})  # only the first update is poisoned
    tr = _trainer(_cfg(tmp_path), tokenizer, base_models)
    before = _weights(tr)
    row1 = tr.train_step(0)
    assert row1["train/nonfinite_run"] == 1 and _same(before, _weights(tr))
    row2 = tr.train_step(1)
    assert row2["train/nonfinite_run"] == 0 and not _same(before, _weights(tr))
    assert all(torch.isfinite(v).all() for v in _weights(tr).values())


def test_inf_gradient_from_a_hook_skips_the_update(tmp_path, tokenizer, base_models):
    tr = _trainer(_cfg(tmp_path), tokenizer, base_models)
    param = next(p for n, p in tr.pair.senior.named_parameters() if "layers.0.mlp" in n)
    handle = param.register_hook(lambda g: torch.full_like(g, float("inf")))
    before = _weights(tr)
    row = tr.train_step(0)
    assert row["train/nonfinite_run"] == 1 and row["train/grad_norm"] == float("inf")
    assert _same(before, _weights(tr)) and not tr.opt.state
    handle.remove()
    assert tr.train_step(1)["train/nonfinite_run"] == 0 and not _same(before, _weights(tr))


def test_max_nonfinite_in_a_row_stops_with_a_checkpoint_and_resumes(tmp_path, tokenizer, base_models, monkeypatch):
    poison_policy_loss(monkeypatch, calls=None)
    cfg = _cfg(tmp_path, "train.steps=4", "train.max_nonfinite=2")
    tr = _trainer(cfg, tokenizer, base_models)
    before = _weights(tr)
    with pytest.raises(TandemError, match=r"2 non-finite updates in a row at step 2; stopped with a checkpoint in "
                                          r".*checkpoints"):
        tr.train()
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    assert (ckpt / "COMPLETE").exists() and (ckpt / "model.safetensors").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["nonfinite_run"] == 2
    saved = load_file(str(ckpt / "model.safetensors"))
    assert all(torch.equal(saved[k], before[k]) for k in saved)  # the checkpoint holds the untouched weights
    assert [r["train/nonfinite_run"] for r in _rows(tmp_path)] == [1, 2]
    assert not (tmp_path / "run" / "final").exists()
    # the cause fixed, the same command resumes from the checkpoint and finishes
    monkeypatch.setattr(core, "policy_loss", _ORIGINAL_POLICY_LOSS)
    tr2 = _trainer(cfg, tokenizer, base_models)
    final = tr2.train()
    assert final.is_dir() and [r["step"] for r in _rows(tmp_path)] == [1, 2, 3, 4]
    assert [r["train/nonfinite_run"] for r in _rows(tmp_path)][2:] == [0, 0]


def test_the_nonfinite_stop_waits_for_its_checkpoint_on_every_process(tmp_path, tokenizer, base_models, monkeypatch):
    """Only the main process writes the checkpoint: every process waits for it before raising, else the others
    exit first and a launcher (torchrun) kills the main one mid-write, so the promised checkpoint never exists."""
    poison_policy_loss(monkeypatch, calls=None)
    tr = _trainer(_cfg(tmp_path, "train.steps=2", "train.max_nonfinite=1"), tokenizer, base_models)
    events, real_save = [], tr.save
    monkeypatch.setattr(tr, "save", lambda: events.append("save") or real_save())
    monkeypatch.setattr(tr.acc, "wait_for_everyone", lambda: events.append("wait"))
    with pytest.raises(TandemError, match="non-finite updates in a row"):
        tr.train()
    assert events[-2:] == ["save", "wait"]


def test_cli_reports_the_nonfinite_stop_in_one_line(tmp_path, model_dirs, monkeypatch, capsys):
    from helpers.run_files import write_config

    from tandem_rlvr.cli import main

    poison_policy_loss(monkeypatch, calls=None)
    cfg = write_config(tmp_path, model_dirs, "grpo", steps=3, save_every=0, max_nonfinite=1)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # write_config has 2 mini-batches (2 updates) per step: both skipped, then the stop at step 1
    assert "tandem-rlvr train: error: 2 non-finite updates in a row at step 1; stopped with a checkpoint" in err
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "COMPLETE").exists()


def test_nan_logits_during_rollout_is_a_clear_error(tmp_path, tokenizer, base_models):
    from helpers.tiny_models import bias_token

    tr = _trainer(_cfg(tmp_path), tokenizer, base_models)
    bias_token(tr.pair.senior, 5, float("nan"))  # e.g. fp16 overflow or weights already corrupt
    with pytest.raises(TandemError, match="non-finite"):
        tr.train_step(0)


# ------------------------------------------------------------------------------------------------

_ORIGINAL_POLICY_LOSS = core.policy_loss


def poison_policy_loss(monkeypatch, calls: set[int] | None):
    """Make ``core.policy_loss`` (as the trainer calls it) return ``NaN * loss`` on the given call numbers
    (all calls when None): a poisoned batch whose gradient is NaN everywhere."""
    count = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, met = _ORIGINAL_POLICY_LOSS(*args, **kwargs)
        n, count["n"] = count["n"], count["n"] + 1
        if calls is None or n in calls:
            loss = loss * float("nan")
        return loss, met

    monkeypatch.setattr(core, "policy_loss", poisoned)


def test_an_fp16_overflow_is_left_to_the_loss_scaler(tmp_path, tokenizer, base_models, monkeypatch):
    """fp16 (CUDA only: accelerate attaches no loss scaler on CPU, so one is attached here by hand). The gradients
    of an overflowed mini-batch were unscaled to measure their norm, so its skipped update must still go through
    the scaler, which skips the optimizer step and halves its scale; else the next mini-batch's unscale raises
    ("unscale_() has already been called on this optimizer since the last update()"). An overflow the scaler
    absorbs (its scale still >= 1) is its business: not a non-finite update toward ``train.max_nonfinite``."""
    poison_policy_loss(monkeypatch, calls={1, 2})  # the last mini-batch of step 0, the first of step 1
    tr = _trainer(_cfg(tmp_path, "algo.mini_batch_prompts=1", "train.max_nonfinite=1"), tokenizer, base_models)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    inner = tr.opt.optimizer
    tr.acc.scaler = scaler  # what accelerate sets up for mixed_precision=fp16 on a GPU: the loss scaled in
    tr.opt.__init__(inner, device_placement=False, scaler=scaler)  # backward, the step through the scaler
    monkeypatch.setattr(tr.acc, "unscale_gradients", lambda optimizer=None: scaler.unscale_(inner), raising=False)
    rows = [tr.train_step(0), tr.train_step(1)]
    assert scaler.get_scale() == 2.0**14  # two overflows backed the scale off twice; the other updates stepped
    assert tr.opt.state and [r["train/nonfinite_run"] for r in rows] == [0, 0]
