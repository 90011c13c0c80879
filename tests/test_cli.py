"""The command line's errors: a missing or broken config file, a bad override or flag value, missing data,
models or columns, an output directory under a file: ``tandem_rlvr.cli.main`` returns 2 with one stderr
line naming the culprit, never a traceback."""

from __future__ import annotations

import pytest

from helpers.cli_runs import cli_lines
from helpers.run_files import write_config
from helpers.run_files import write_jsonl as _jsonl
from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from helpers.tiny_models import save_vision_model as _save_vision_model
from tandem_rlvr.cli import main


def _cli(capsys, argv):
    """Run the CLI; return (exit code, stderr) and check the error is one line without a traceback."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


def _one_error_line(err: str) -> str:
    """The single error line, which ends stderr (progress bars of model loading may precede it)."""
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("tandem-rlvr")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


def test_cli_missing_config_file(tmp_path, capsys):
    rc, err = _cli(capsys, ["train", str(tmp_path / "nope.yaml")])
    assert rc == 2
    assert _one_error_line(err).startswith(f"tandem-rlvr train: error: config file '{tmp_path / 'nope.yaml'}' does not "
                                           "exist and is no shipped config's name (shipped: grpo, kl_reg, paper/grpo,")


def test_cli_bad_yaml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {senior: x\n  junior: [\n")
    rc, err = _cli(capsys, ["train", str(bad)])
    assert rc == 2 and "bad.yaml' is not valid YAML" in _one_error_line(err)


def test_cli_bad_override_names_the_key(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), "algo.group_size=1"])
    assert rc == 2 and "'algo.group_size' must be >= 2" in _one_error_line(err)


def test_cli_unknown_subcommand_returns_2(capsys):
    rc, err = _cli(capsys, ["bogus"])
    assert rc == 2 and "invalid choice: 'bogus'" in err
    rc, err = _cli(capsys, [])
    assert rc == 2 and "required" in err


def test_cli_missing_training_data_file(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs, data={"train": str(tmp_path / "gone.jsonl")})
    rc, err = _cli(capsys, ["train", str(cfg)])
    assert rc == 2 and f"data: {tmp_path / 'gone.jsonl'}: no such file" in _one_error_line(err)


def test_cli_missing_column_in_training_data(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs, data={"problem_key": "question"})
    rc, err = _cli(capsys, ["train", str(cfg)])
    assert rc == 2 and "no column 'question'; available columns: 'problem', 'answer'" in _one_error_line(err)


def test_cli_non_causal_senior(tmp_path, model_dirs, tokenizer, capsys):
    vit = _save_vision_model(tmp_path / "vit", "vit", tokenizer)
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"model.senior={vit}"])
    assert rc == 2 and f"senior model '{vit}' (model_type='vit') is not a causal LM" in _one_error_line(err)


def test_cli_out_dir_under_a_file(tmp_path, model_dirs, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"train.out_dir={blocker / 'run'}"])
    assert rc == 2 and str(blocker) in _one_error_line(err)


def test_cli_eval_with_a_missing_model(tmp_path, model_dirs, capsys):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    missing = tmp_path / "no_model"
    base = ["eval", "--benchmark", str(bench), "--out", str(tmp_path / "out"), "--no-progress"]
    rc, err = _cli(capsys, [*base, "--senior", str(model_dirs[0]), "--junior", str(missing)])
    assert rc == 2 and f"junior model path '{missing}' does not exist" in _one_error_line(err)
    rc, err = _cli(capsys, [*base, "--senior", f"mine={missing}", "--junior", str(model_dirs[1])])
    assert rc == 2 and f"'{missing}' does not exist" in _one_error_line(err)
    rc, err = _cli(capsys, [*base, "--senior", str(model_dirs[0]), "--junior", "not-a-dir-or-hub-name"])
    assert rc == 2 and "'not-a-dir-or-hub-name'" in _one_error_line(err)


@pytest.mark.parametrize("ps", ["0.5,abc", "0.5,1.5", ""])
def test_bad_curve_ps_is_one_line(tmp_path, capsys, ps):
    rc, err = cli_lines(capsys, ["eval", "--senior", "s", "--junior", "j", "--benchmark", "b", "--curve-ps", ps,
                            "--out", str(tmp_path / "o")])
    assert rc == 2 and len(err) == 1 and "--curve-ps" in err[0], err


def test_bad_eval_config_value_is_one_line(tmp_path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text("senior: s\njunior: j\nbenchmark: b\nn: abc\n")
    rc, err = cli_lines(capsys, ["eval", "--config", str(f), "--out", str(tmp_path / "o")])
    assert rc == 2 and len(err) == 1 and "eval option 'n' (--n) must be int" in err[0], err
