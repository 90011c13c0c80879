"""Every cheap input is checked before the expensive work: ``eval`` checks every model path and its output
directory, ``train`` its validation data, reward and junior before the first forward pass or model load, and
the demo its options and output directory before it builds the world."""

import pytest

from helpers.cli_runs import cli_lines as _cli
from helpers.run_files import write_config
from helpers.run_files import write_jsonl as _jsonl
from tandem_rlvr import preflight


@pytest.fixture
def no_forward(monkeypatch):
    calls = []
    import tandem_rlvr.evaluation.evaluate as ev
    import tandem_rlvr.training.trainer as tr

    monkeypatch.setattr(ev, "evaluate_pair", lambda *a, **k: calls.append("eval") or pytest.fail("forward pass"))
    monkeypatch.setattr(tr.Trainer, "train_step", lambda *a, **k: calls.append("train") or pytest.fail("forward pass"))
    return calls


def test_eval_checks_every_senior_before_evaluating_the_first(tmp_path, model_dirs, capsys, no_forward):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    typo = tmp_path / "no_such_model"
    rc, err = _cli(capsys, ["eval", "--senior", f"a={model_dirs[0]}", "--senior", f"b={typo}", "--junior",
                            str(model_dirs[1]), "--benchmark", str(bench), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 2 and f"'{typo}' does not exist" in err[-1] and no_forward == []


def test_eval_checks_the_output_directory_first(tmp_path, model_dirs, capsys, no_forward):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, err = _cli(capsys, ["eval", "--senior", str(model_dirs[0]), "--junior", str(model_dirs[1]), "--benchmark",
                            str(bench), "--out", str(blocker / "o"), "--no-progress"])
    assert rc == 2 and str(blocker) in err[-1] and no_forward == []


def test_train_checks_validation_data_before_the_first_step(tmp_path, model_dirs, capsys, no_forward):
    cfg = write_config(tmp_path, model_dirs)
    missing = tmp_path / "val_missing.jsonl"
    rc, err = _cli(capsys, ["train", str(cfg), f"val.data={missing}", "val.every=1"])
    assert rc == 2 and str(missing) in err[-1] and no_forward == []
    rc, err = _cli(capsys, ["train", str(cfg), "data.reward=no_such_module:fn"])
    assert rc == 2 and "no_such_module" in err[-1] and no_forward == []


def test_train_checks_the_junior_before_loading_the_senior(tmp_path, model_dirs, capsys, monkeypatch):
    import tandem_rlvr.models as models

    loads = []
    real = models.load_causal_lm
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"model.junior={tmp_path / 'typo'}"])
    assert rc == 2 and "typo" in err[-1] and loads == []


def test_demo_checks_its_inputs_before_building_the_world(tmp_path, monkeypatch):
    import tandem_rlvr.world.build as build

    monkeypatch.setattr(build, "build_world", lambda *a, **k: pytest.fail("the world was built"))
    from tandem_rlvr.demo import run_demo
    from tandem_rlvr.errors import TandemError

    with pytest.raises(TandemError, match="--seeds"):
        run_demo(tmp_path / "d", seeds=0)
    with pytest.raises(TandemError, match="workers"):
        run_demo(tmp_path / "d", workers=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TandemError, match="not a writable directory"):
        run_demo(blocker / "d")
    assert preflight.check_writable(tmp_path / "new" / "dir", "x") is None and (tmp_path / "new" / "dir").is_dir()
