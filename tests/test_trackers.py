"""train.trackers: a tracker that cannot log is an error before training; TensorBoard logs what metrics.jsonl holds."""

import json

import pytest

from tandem_rlvr import trackers
from tandem_rlvr.errors import TandemError
from tandem_rlvr.training.trainer import Trainer
from helpers.trainers import base_models as models  # noqa: F401 (fixture: the two tiny models)
from helpers.trainers import word_trainer as _trainer


def test_a_missing_tracker_package_is_a_clear_error_before_training(tmp_path, tokenizer, models, monkeypatch):  # noqa: F811
    monkeypatch.setattr(trackers, "_importable", lambda module: False)
    with pytest.raises(TandemError, match=r"needs the tensorboard package.*tandem-rlvr\[tensorboard\]"):
        _trainer(tmp_path, tokenizer, models, "train.trackers=[tensorboard]")
    with pytest.raises(TandemError, match=r"tandem-rlvr\[wandb\]"):
        trackers.check_trackers(["wandb"])
    with pytest.raises(TandemError, match="unknown tracker 'tensorbord'"):
        trackers.check_trackers(["tensorbord"])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_tensorboard_writes_the_metrics_of_metrics_jsonl(tmp_path, tokenizer, models):  # noqa: F811
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = _trainer(tmp_path, tokenizer, models, "train.trackers=[tensorboard]", "train.steps=2")
    assert isinstance(tr, Trainer)
    tr.train()
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    events = sorted(run.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {run}"
    scalars: dict = {}
    for d in sorted({e.parent for e in events}):
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(acc.Scalars(tag))
    keys = {k for r in rows for k in r if k != "step"}
    assert keys <= scalars.keys(), sorted(keys - scalars.keys())
    for key in keys:
        logged = {e.step: e.value for e in scalars[key]}
        expected = {r["step"]: r[key] for r in rows if key in r}
        assert logged.keys() == expected.keys(), key
        for step, v in expected.items():
            assert logged[step] == pytest.approx(v, rel=1e-6, abs=1e-6), (key, step)
