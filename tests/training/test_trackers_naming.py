"""Trackers as users name them (train.project, run_name, group, tags), one tracker run per run directory
(wandb's id kept in trackers.json; TensorBoard told to hide what an interrupted attempt logged past the
checkpoint), plain progress lines in a log file, and sampled co-written completions with their authors."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from accelerate import Accelerator

from helpers.trainers import EXAMPLES, length_reward, trainer_config
from helpers.trainers import base_models as models  # noqa: F401 (fixture: the two tiny models)
from tandem_rlvr import trackers
from tandem_rlvr.config import ConfigError, Config, load_config, save_config
from tandem_rlvr.engines.types import Rollout
from tandem_rlvr.models import Pair
from tandem_rlvr.training import rundir
from tandem_rlvr.training.trainer import make_trainer


def _train(cfg, tokenizer, models, restart=False):  # noqa: F811
    s, j = models
    tr = make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                      examples=EXAMPLES, restart=restart)
    try:
        return tr.train()
    finally:
        tr.lock.release()


@pytest.fixture
def init_calls(monkeypatch):
    """What the run passes to accelerate's init_trackers (wandb is not installed here: every tracker counts as
    installed, and accelerate's own init is replaced by a recorder)."""
    calls = []
    monkeypatch.setattr(trackers, "_importable", lambda module: True)
    monkeypatch.setattr(Accelerator, "init_trackers",
                        lambda self, project, config=None, init_kwargs=None: calls.append((project, config, init_kwargs)))
    return calls


def test_wandb_gets_the_names_and_a_resumed_run_continues_the_same_wandb_run(tmp_path, tokenizer, models, init_calls):  # noqa: F811
    named = ["train.trackers=[wandb]", "train.project=tandem-tests", "train.group=sweep-1", "train.tags=trlvr,tiny",
             "train.save_every=1"]
    _train(trainer_config(tmp_path, "trlvr", *named), tokenizer, models)
    run = tmp_path / "trlvr"
    project, config, kw = init_calls[0]
    wandb_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    assert re.fullmatch(r"[a-z0-9]{8}", wandb_id)
    assert project == "tandem-tests" and config["train.group"] == "sweep-1"
    assert kw == {"wandb": {"id": wandb_id, "resume": "allow", "name": "trlvr", "group": "sweep-1",
                            "tags": ["trlvr", "tiny"]}}
    # requeued with more steps and another run name (both may change on resume): the same wandb run
    _train(trainer_config(tmp_path, "trlvr", *named, "train.steps=3", "train.run_name=trlvr-long"), tokenizer, models)
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert init_calls[1][2]["wandb"] == {**kw["wandb"], "name": "trlvr-long"}
    # --restart starts over: a new wandb run
    _train(trainer_config(tmp_path, "trlvr", *named), tokenizer, models, restart=True)
    assert init_calls[2][2]["wandb"]["id"] not in (wandb_id, None)


def test_tensorboard_resume_hides_the_interrupted_attempts_steps(tmp_path, tokenizer, models):  # noqa: F811
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    over = ["train.trackers=[tensorboard]", "train.save_every=1", "train.log_samples=2", "train.log_every=1"]
    cfg = trainer_config(tmp_path, "trlvr", *over)
    _train(cfg, tokenizer, models)
    run = tmp_path / "trlvr"
    first = set(run.rglob("events.out.tfevents.*"))
    # an attempt killed after logging step 2 but before its checkpoint: step-2 moved out of the run
    (run / "checkpoints" / "step-2").rename(tmp_path / "moved-step-2")
    _train(cfg, tokenizer, models)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [1, 1, 2, 2]  # step 2's rows of the killed attempt are gone
    new = sorted(set(run.rglob("events.out.tfevents.*")) - first)
    events = [e for path in new for e in EventFileLoader(str(path)).Load()]
    purge = [e.step for e in events if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    assert purge == [2], purge  # TensorBoard hides step >= 2 of the earlier files
    main_dir = run / "tandem-rlvr"
    acc = EventAccumulator(str(main_dir), size_guidance={"tensors": 0})
    acc.Reload()
    assert any(t.startswith("samples") for t in acc.Tags()["tensors"]), acc.Tags()


def test_a_log_file_gets_one_plain_line_every_log_every_steps(tmp_path, tokenizer, models, capsys):  # noqa: F811
    cfg = trainer_config(tmp_path, "trlvr", "train.progress=true", "train.steps=3", "train.log_every=2")
    _train(cfg, tokenizer, models)
    err = capsys.readouterr().err  # pytest's stderr is no terminal, as a SLURM log is not
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("train trlvr:")]
    assert [re.search(r"step (\d+)/3", ln).group(1) for ln in lines] == ["2", "3"], err
    assert all(re.search(r"reward=\d\.\d{3} senior=\d\.\d\d loss=\S+ .*s/step", ln) for ln in lines), lines


def _rollout(tokenizer) -> Rollout:
    """Four rows (two prompts x two), five response tokens each; row r's owners in ``owners[r]``."""
    ids = tokenizer("1 2 3 4 5", add_special_tokens=False)["input_ids"][:5]
    owners = [[1, 1, 0, 0, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]]
    B, T = len(owners), len(ids)
    return Rollout(prompt_ids_BP=torch.ones(B, 1, dtype=torch.long), prompt_mask_BP=torch.ones(B, 1, dtype=torch.long),
                   response_ids_BT=torch.tensor([ids] * B), response_mask_BT=torch.ones(B, T, dtype=torch.long),
                   owner_BT=torch.tensor(owners), senior_logps_BT=torch.zeros(B, T), junior_logps_BT=None,
                   rounds_B=torch.ones(B, dtype=torch.long), finished_B=torch.ones(B, dtype=torch.bool))


def test_sampled_completions_keep_their_authors(tokenizer):
    ro = _rollout(tokenizer)
    info = [{"problem_id": str(r // 2), "problem": f"p{r // 2}", "gold": "5"} for r in range(4)]
    rows = trackers.sample_rows(ro, tokenizer, 7, 3, 2, info, torch.tensor([1.0, 0.0, 0.5, 0.25]))
    assert [(r["problem"], r["reward"]) for r in rows] == [("p0", 1.0), ("p1", 0.5), ("p0", 0.0)]  # one per prompt first
    first = rows[0]
    assert [(t["owner"], t["tokens"]) for t in first["turns"]] == [("senior", 2), ("junior", 2), ("senior", 1)]
    assert first["senior_token_frac"] == pytest.approx(0.6) and first["step"] == 7
    assert [(t["owner"], t["tokens"]) for t in rows[1]["turns"]] == [("junior", 1), ("senior", 4)]
    texts = [t["text"] for t in first["turns"]]
    assert trackers.marked(first["turns"]) == f"[S]{texts[0]}[J]{texts[1]}[S]{texts[2]}"


def test_samples_go_to_wandb_as_a_table_and_to_tensorboard_as_text(tokenizer):
    class Fake:
        def __init__(self, name):
            self.name, self.calls = name, []

        def log_table(self, *a, **kw):
            self.calls.append(("table", a, kw))

        def log(self, *a, **kw):
            self.calls.append(("log", a, kw))

    class Acc:
        trackers = [Fake("wandb"), Fake("tensorboard"), Fake("mlflow")]

    info = [{"problem_id": "0", "problem": "p0", "gold": "5"}] * 4
    rows = trackers.sample_rows(_rollout(tokenizer), tokenizer, 3, 1, 2, info, torch.ones(4))
    trackers.log_samples(Acc, rows, 3)
    wandb, tb, other = Acc.trackers
    (kind, args, kw), = wandb.calls
    assert kind == "table" and args == ("samples",) and kw["step"] == 3 and kw["columns"] == trackers.SAMPLE_COLUMNS
    assert kw["data"] == [[3, "p0", "5", 1.0, pytest.approx(0.6), trackers.marked(rows[0]["turns"])]]
    (kind, args, kw), = tb.calls
    assert kind == "log" and "[S]" in args[0]["samples"] and "[J]" in args[0]["samples"] and kw == {"step": 3}
    assert other.calls == []


@pytest.mark.parametrize("override, key", [
    ("train.project=team/proj", "train.project"), ("train.project=checkpoints", "train.project"),
    ("train.project=.hidden", "train.project"), ("train.tags=[2024]", "train.tags"),
    (f"train.group={'g' * 129}", "train.group"), (f"train.run_name={'n' * 129}", "train.run_name"),
    ("train.log_every=0", "train.log_every"), ("train.log_samples=-1", "train.log_samples"),
])
def test_bad_tracker_names_are_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        load_config(None, ["model.senior=x", "model.junior=y", override])


def test_names_may_change_on_resume_but_not_the_project():
    old = Config().to_dict()
    new = copy.deepcopy(old)
    new["train"].update(run_name="b", group="g", tags=["t"], log_every=3, log_samples=2)
    assert rundir.config_changes(old, new) == []
    new["train"]["project"] = "other"
    assert rundir.config_changes(old, new) == ["train.project: 'tandem-rlvr' -> 'other'"]


def test_restart_deletes_the_tracker_files_and_the_projects_tensorboard_folder(tmp_path):
    cfg = load_config(None, ["model.senior=x", "model.junior=y", f"train.out_dir={tmp_path / 'run'}",
                             "train.trackers=[tensorboard]", "train.project=myproj"])
    run = tmp_path / "run"
    (run / "myproj").mkdir(parents=True)
    save_config(cfg, run / "config.yaml")
    for name in ("trackers.json", "samples.jsonl", ".trackers.json.x1.tmp", "myproj/events.out.tfevents.1.host",
                 "myproj/hparams.yml"):
        (run / name).write_text("{}")
    assert rundir.first_foreign(run) is None
    rundir.clear_run(run)
    assert sorted(p.name for p in run.iterdir()) == []
    (run / "tandem-rlvr").mkdir()  # the default project's folder is no run's file under project myproj's config
    save_config(cfg, run / "config.yaml")
    assert rundir.first_foreign(run) == run / "tandem-rlvr"


def test_the_cli_writes_a_readable_log_file(tmp_path, model_dirs):
    """`tandem-rlvr train ... > train.log 2>&1`, as a SLURM job: plain lines, no bar redraws, no library's bars
    or INFO lines; the sampled completions beside the metrics."""
    import os
    import subprocess
    import sys

    from helpers.paths import TESTS
    from helpers.run_files import write_config

    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=4,
                       save_every=0, progress=True, log_every=2, log_samples=2)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "train.log"
    with log.open("wb") as f:
        rc = subprocess.run([sys.executable, "-m", "tandem_rlvr", "train", str(cfg)], stdout=f, stderr=subprocess.STDOUT,
                            env=env, timeout=600).returncode
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "\r" not in text and "Loading weights" not in text, text
    assert not [ln for ln in text.splitlines() if ln.startswith("INFO ") and not ln.startswith("INFO tandem_rlvr")], text
    steps = [re.search(r"step (\d)/4", ln).group(1) for ln in text.splitlines() if ln.startswith("train trlvr: step")]
    assert steps == ["2", "4"], text
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [2, 2, 4, 4] and all(r["turns"] for r in samples)


def test_a_start_from_step_zero_opens_a_new_wandb_run_and_a_resume_the_same(tmp_path):
    """An attempt that stopped before its first checkpoint starts again from step 0: its steps would be shadowed
    by the old wandb run's (wandb keeps the first value of a step), so it draws a new id; a resume keeps it."""
    from types import SimpleNamespace

    from tandem_rlvr.trackers import init_kwargs

    train = SimpleNamespace(trackers=["wandb"], run_name="", group="", tags=[])
    first = init_kwargs(train, tmp_path, 0)["wandb"]["id"]
    resumed = init_kwargs(train, tmp_path, 3)["wandb"]["id"]
    again = init_kwargs(train, tmp_path, 0)["wandb"]["id"]
    assert resumed == first and again != first
    assert init_kwargs(train, tmp_path, 5)["wandb"]["id"] == again
