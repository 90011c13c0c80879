"""A resume that proves it resumed: the resumed trainer starts at the checkpoint's step, executes only
the remaining steps (counted), and ends bit-exact with an uninterrupted run.

Runs are deterministic, so a trainer that silently started over would also end identical; counting the
steps the resumed process executes is what tells the two apart. (tests/training/test_resume.py covers SIGKILLs
of the command line, during checkpoint writes included.)
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from helpers.tiny_models import make_tiny_model
from helpers.trainers import examples, spread_reward
from tandem_rlvr.config import load_config
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.training.trainer import Trainer, make_trainer

STEPS, SAVE_EVERY, CRASH_AT = 4, 2, 3  # checkpoint at step 2; the crash comes in step 4 (index 3), after row 3
EXAMPLES = examples(8)
VOLATILE = ("time/",)  # wall-clock timings; every other key must match


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def models(tokenizer):
    return make_tiny_model(len(tokenizer), 0, 48), freeze(make_tiny_model(len(tokenizer), 1, 32))


def _trainer(out_dir, tokenizer, models):
    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused", f"train.steps={STEPS}",
                             "train.prompts_per_step=2", "algo.group_size=4", "algo.mini_batch_prompts=1",
                             "rollout.max_new_tokens=12", f"train.out_dir={out_dir}", "algo.lr=1e-3",
                             f"train.save_every={SAVE_EVERY}", "train.keep_last=3", "train.progress=false"])
    s, j = models
    return make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=spread_reward,
                   examples=EXAMPLES)


def _count_steps(tr: Trainer, crash_at: int | None = None) -> list[int]:
    """Record the step index of every ``train_step`` (and ``rollout``) the trainer executes."""
    executed: list[int] = []
    real_step, real_rollout = tr.train_step, tr.rollout

    def train_step(step):
        executed.append(step)
        if step == crash_at:
            raise Crash(f"planted crash in step {step + 1}")
        return real_step(step)

    def rollout(step):
        executed.append(("rollout", step))
        return real_rollout(step)

    tr.train_step, tr.rollout = train_step, rollout
    return executed


def _rows(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_resume_executes_only_the_remaining_steps_and_ends_bit_exact(tmp_path, tokenizer, models):
    ref = tmp_path / "ref"
    _trainer(ref, tokenizer, models).train()

    run = tmp_path / "run"
    first = _trainer(run, tokenizer, models)
    done = _count_steps(first, crash_at=CRASH_AT)
    with pytest.raises(Crash):
        first.train()
    assert [s for s in done if isinstance(s, int)] == [0, 1, 2, 3]
    assert [r["step"] for r in _rows(run)] == [1, 2, 3], "the crash leaves row 3, past the step-2 checkpoint"
    saved = [int(d.name.split("-")[1]) for d in (run / "checkpoints").iterdir() if d.name.startswith("step-")]
    assert saved and SAVE_EVERY <= max(saved) < STEPS, saved  # (a crash-time save would be newer)
    ckpt_step = max(saved)

    resumed = _trainer(run, tokenizer, models)
    executed = _count_steps(resumed)
    resumed.train()
    remaining = list(range(ckpt_step, STEPS))
    assert [s for s in executed if isinstance(s, int)] == remaining, \
        f"the resumed trainer ran steps {executed}, expected only {remaining} (from the step-{ckpt_step} checkpoint)"
    assert [s for s in executed if not isinstance(s, int)] == [("rollout", s) for s in remaining]
    assert resumed.step == STEPS

    ref_rows = _rows(ref)
    assert [r["step"] for r in ref_rows] == list(range(1, STEPS + 1))
    assert any(r["train/grad_norm"] > 0 for r in ref_rows), "the run must train"
    assert _rows(run) == ref_rows, "rows differ from the uninterrupted run (row 3 must be rewritten, once)"
    a, b = load_file(str(run / "final" / "model.safetensors")), load_file(str(ref / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights are not bit-exact"
    first_w = load_file(str(run / "checkpoints" / f"step-{ckpt_step}" / "model.safetensors"))
    assert any(not torch.equal(first_w[k], a[k]) for k in a), "the resumed steps must change the weights"


def test_train_steps_lowered_below_the_newest_checkpoint_is_refused(tmp_path):
    """A run checkpointed at step 4 (its end), rerun with train.steps=2: it cannot resume to an earlier step (it
    would call the step-4 senior the 2-step run's), so the rerun stops in one line, changing nothing; train.steps
    equal to the checkpoint's step (nothing left to train) or above it resumes."""
    from tandem_rlvr import integrity
    from tandem_rlvr.errors import TandemError
    from tandem_rlvr.training import checkpoint as ck, rundir

    run = tmp_path / "run"

    def cfg(steps):
        return load_config(None, ["model.senior=s", "model.junior=j", f"train.out_dir={run}", f"train.steps={steps}",
                                  "train.save_every=2"])

    assert rundir.prepare(run, cfg(4), restart=False) is None
    for step in (2, 4):
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"step": step}))
        integrity.write_checksums(d)
        (d / ck.MARKER).write_text("ok\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 5)))
    saved = (run / "config.yaml").read_text()
    with pytest.raises(TandemError, match=r"train.steps=2 is below the step of this run's newest checkpoint") as e:
        rundir.prepare(run, cfg(2), restart=False)
    assert "step-4" in str(e.value) and "\n" not in str(e.value)
    assert (run / "config.yaml").read_text() == saved and len((run / "metrics.jsonl").read_text().splitlines()) == 4
    assert rundir.prepare(run, cfg(4), restart=False) == run / "checkpoints" / "step-4"
    assert rundir.prepare(run, cfg(6), restart=False) == run / "checkpoints" / "step-4"


@pytest.mark.parametrize("decay,said", [("cosine", True), ("linear", True), ("constant", False)])
def test_a_longer_run_under_a_decaying_rate_says_the_rate_jumps(tmp_path, caplog, decay, said):
    """train.steps may change on resume; under a linear or cosine decay the schedule then follows the new length from
    the resumed step on (its rate jumps there): the resume says so; a constant rate has nothing to say."""
    import logging

    from tandem_rlvr import integrity
    from tandem_rlvr.training import checkpoint as ck, rundir

    run = tmp_path / "run"

    def cfg(steps):
        return load_config(None, ["model.senior=s", "model.junior=j", f"train.out_dir={run}", f"train.steps={steps}",
                                  "train.save_every=2", f"algo.lr_decay={decay}"])

    rundir.prepare(run, cfg(4), restart=False)
    d = run / "checkpoints" / "step-4"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"step": 4}))
    integrity.write_checksums(d)
    (d / ck.MARKER).write_text("ok\n")
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.training.rundir"):
        rundir.prepare(run, cfg(4), restart=False)
        assert not [r for r in caplog.records if "jumps" in r.getMessage()]
        rundir.prepare(run, cfg(8), restart=False)
    lines = [r.getMessage() for r in caplog.records if "jumps" in r.getMessage()]
    assert len(lines) == int(said) and (not said or "train.steps 4 -> 8" in lines[0])
