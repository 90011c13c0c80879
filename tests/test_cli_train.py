"""`tandem-rlvr train` from the command line on tiny local models writes every output."""

import json

import pytest
import yaml

from helpers.run_files import write_config
from tandem_rlvr.cli import main


@pytest.mark.parametrize("arm", ["trlvr", "grpo", "kl_reg"])
def test_cli_train_writes_every_output(tmp_path, model_dirs, arm):
    from transformers import AutoModelForCausalLM

    cfg = write_config(tmp_path, model_dirs, arm)
    assert main(["train", str(cfg), "train.seed=1"]) == 0
    run = tmp_path / "run"
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["train"]["seed"] == 1 and resolved["algo"]["arm"] == arm
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("step", "train/loss", "reward/mean", "rollout/senior_token_frac", "train/frac_zero_std_groups",
                "kl/senior_junior", "time/step_s"):
        assert all(key in r for r in rows), key
    assert (run / "checkpoints" / "step-2" / "model.safetensors").exists()
    assert (run / "final" / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(str(run / "final"))
    assert model.config.vocab_size > 0


def test_cli_reports_config_errors_in_one_line(tmp_path, model_dirs, capsys):
    cfg = write_config(tmp_path, model_dirs)
    assert main(["train", str(cfg), "algo.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'algo.lrr'" in err and "Traceback" not in err
    assert main(["train", str(cfg), "handoff.p=1.5"]) == 2
    assert "handoff.p" in capsys.readouterr().err
