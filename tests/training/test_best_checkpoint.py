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
