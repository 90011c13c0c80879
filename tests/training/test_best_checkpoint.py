"""best/ is chosen as the paper's authors chose it: val.select (e.g. pass@4) picks the step, best.json says which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.run_files import write_config

from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.training.trainer import best_step

# A recorded validation log (as metrics.jsonl holds it): pass@1 peaks at step 40, pass@4 at step 120.
RECORDED = [
    {"step": 20, "val/pass@1": 0.40, "val/pass@4": 0.60},
    {"step": 21, "train/loss": 0.1},
    {"step": 40, "val/pass@1": 0.46, "val/pass@4": 0.62},
    {"step": 80, "val/pass@1": 0.45, "val/pass@4": 0.66},
    {"step": 120, "val/pass@1": 0.44, "val/pass@4": 0.71},
    {"step": 160, "val/pass@1": 0.46, "val/pass@4": 0.71},  # ties keep the earlier step
]


def test_val_select_picks_the_step_a_hand_computation_picks(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert best_step(rows, "val/pass@4") == (120, 0.71)  # by hand: max 0.71 first reached at step 120
    assert best_step(rows, "val/pass@1") == (40, 0.46)
    assert best_step([{"step": 1, "train/loss": 0.0}], "val/pass@4") == (None, None)


@pytest.mark.parametrize("select,n,ok", [("pass@4", 4, True), ("pass@1", 1, True), ("pass@4", 2, False),
                                         ("pass@3", 4, False), ("mean", 4, False)])
def test_val_select_must_be_a_pass_at_k_that_validation_computes(select, n, ok):
    over = ["model.senior=s", "model.junior=j", f"val.select={select}", f"val.n={n}"]
    if ok:
        assert load_config(None, over).val.select == select
    else:
        with pytest.raises(ConfigError, match="val.select"):
            load_config(None, over)


def test_the_trainer_keeps_the_selected_step_and_says_so(tmp_path, model_dirs, monkeypatch):
    """A real run validating every step with 2 samples: best/best.json holds the step best_step picks from
    its own metrics.jsonl for val/pass@2, and best/ holds that step's weights. best.json is inside the
    directory before it is published (renamed to best/), so best/ never appears without it."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.training import checkpoint as ck

    published, real_publish = [], ck.publish_dir

    def publish(tmp, final):
        if Path(final).name == "best":
            published.append(json.loads((Path(tmp) / "best.json").read_text()))
        real_publish(tmp, final)

    monkeypatch.setattr(ck, "publish_dir", publish)

    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=4, save_every=0)
    c = yaml.safe_load(cfg.read_text())
    c["val"] = {"data": c["data"]["train"], "every": 1, "n": 2, "limit": 4, "select": "pass@2"}
    cfg.write_text(yaml.safe_dump(c))
    assert main(["train", str(cfg)]) == 0
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step, value = best_step(rows, "val/pass@2")
    assert step is not None
    best = json.loads((run / "best" / "best.json").read_text())
    assert best == {"metric": "val/pass@2", "value": value, "step": step}
    assert published and published[-1] == best and [b["step"] for b in published] == sorted({b["step"] for b in published})
    assert (run / "best" / "model.safetensors").is_file()


def test_a_run_killed_between_best_and_its_first_checkpoint_reruns_and_rewrites_best(tmp_path, model_dirs, monkeypatch):
    """Validation publishes best/ at step 2, then the kill comes before that step's (the first) checkpoint: the
    same command reruns from step 0 (best/ is this run's own, best.json says from which step) instead of refusing,
    and writes best/ anew."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.training import checkpoint as ck
    from tandem_rlvr.training import trainer as trainer_mod

    class Killed(Exception):
        pass

    def killed(self):
        raise Killed("planted kill before the step's checkpoint")

    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=3,
                       save_every=2)
    c = yaml.safe_load(cfg.read_text())
    c["val"] = {"data": c["data"]["train"], "every": 2, "n": 2, "limit": 2, "select": "pass@2"}
    cfg.write_text(yaml.safe_dump(c))
    with monkeypatch.context() as m:
        m.setattr(trainer_mod.Trainer, "save", killed)
        with pytest.raises(Killed):
            main(["train", str(cfg)])
    run = tmp_path / "run"
    assert json.loads((run / "best" / "best.json").read_text())["step"] == 2
    assert not ck.complete_checkpoints(run) and not (run / "final").exists()
    published, real_publish = [], ck.publish_dir

    def publish(tmp, final):
        published.append(Path(final).name)
        real_publish(tmp, final)

    monkeypatch.setattr(ck, "publish_dir", publish)
    assert main(["train", str(cfg)]) == 0
    assert published.count("best") >= 1 and (run / "final").is_dir()
    assert [r["step"] for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]


def _best_json(run: Path) -> dict | None:
    path = run / "best" / "best.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_best_past_the_resumed_step_is_removed_whole(tmp_path):
    """cut_best_back: a best/ of a later step than the resume's is removed (through .trash-best, never left
    half-deleted as best/ or .best.old, which the next start would put back); one of the step or before, or a
    best/ without a readable best.json, is kept; a .trash-best a kill left is removed. Where the checkpoint's
    record of the best is of the resumed step itself, the best.json to write again with its weights comes back."""
    from tandem_rlvr.training import checkpoint as ck

    run = tmp_path / "run"

    def later_best():
        (run / "best").mkdir(parents=True, exist_ok=True)
        (run / "best" / "model.safetensors").write_text("w")
        (run / "best" / "best.json").write_text(json.dumps({"metric": "val/pass@1", "value": 0.5, "step": 3}))

    later_best()
    (run / "best" / "best.json").unlink()
    assert ck.cut_best_back(run, 2) is None and (run / "best" / "model.safetensors").exists()  # no best.json
    later_best()
    (run / ".trash-best").mkdir()
    assert ck.cut_best_back(run, 3) is None and _best_json(run)["step"] == 3
    assert not (run / ".trash-best").exists()
    assert ck.cut_best_back(run, 2) is None and sorted(p.name for p in run.iterdir()) == []
    ck.recover_publishes(run)
    assert not (run / "best").exists()
    later_best()
    assert ck.cut_best_back(run, 2, {"val": 0.25, "step": 1, "metric": "val/pass@1"}) is None  # no copy of step 1
    assert not (run / "best").exists()
    later_best()
    record = {"val": 0.25, "step": 2, "metric": "val/pass@1"}
    assert ck.cut_best_back(run, 2, record) == {"metric": "val/pass@1", "value": 0.25, "step": 2}
    assert not (run / "best").exists()


def _killed_after_best_at(monkeypatch, step: int):
    """publish_dir that raises (a kill) right after best/ of ``step`` is published."""
    from tandem_rlvr.training import checkpoint as ck

    class Killed(Exception):
        pass

    real_publish = ck.publish_dir

    def publish(tmp, final):
        record = json.loads((Path(tmp) / "best.json").read_text()) if Path(final).name == "best" else {}
        real_publish(tmp, final)
        if record.get("step") == step:
            raise Killed(f"planted kill after best/ of step {step}")

    monkeypatch.setattr(ck, "publish_dir", publish)
    return Killed


def _val_config(tmp_path, model_dirs, every: int, **train) -> Path:
    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, **train)
    c = yaml.safe_load(cfg.read_text())
    c["val"] = {"data": c["data"]["train"], "every": every, "n": 2, "limit": 2, "select": "pass@2"}
    cfg.write_text(yaml.safe_dump(c))
    return cfg


@pytest.mark.parametrize("every,best_after", [(3, None), (1, 2)])
def test_a_best_written_after_the_last_checkpoint_does_not_survive_a_shorter_resume(tmp_path, model_dirs, monkeypatch,
                                                                                   every, best_after):
    """A kill right after validation published best/ at step 3 (the checkpoint is step 2), then the same run
    resumed with train.steps=2 (a resumable change): best/ is what an uninterrupted 2-step run leaves. Validation
    at step 3 only: no best/ (it stayed, from a step the run never reached). Validation every step, each better
    than the last: best/ of step 2, with the weights of the uninterrupted run's best/."""
    from safetensors.torch import load_file

    from tandem_rlvr.cli import main
    from tandem_rlvr.evaluation import validation

    monkeypatch.setattr(validation, "validate", lambda *a, step, **k: {"val/pass@2": step / 10})  # each step better
    run, ref = tmp_path / "run", tmp_path / "ref"
    with monkeypatch.context() as m:
        killed = _killed_after_best_at(m, 3)
        with pytest.raises(killed):
            main(["train", str(_val_config(tmp_path, model_dirs, every, steps=4, save_every=2))])
    assert _best_json(run)["step"] == 3
    assert main(["train", str(_val_config(tmp_path, model_dirs, every, steps=2, save_every=2))]) == 0
    assert (run / "final").is_dir() and not (run / ".trash-best").exists()
    assert main(["train", str(_val_config(tmp_path, model_dirs, every, steps=2, save_every=2, out_dir=str(ref)))]) == 0
    assert _best_json(run) == _best_json(ref) and (_best_json(ref) or {}).get("step") == best_after
    if best_after is not None:
        got, want = (load_file(str(r / "best" / "model.safetensors")) for r in (run, ref))
        assert got.keys() == want.keys() and all(bool((got[k] == want[k]).all()) for k in want)
