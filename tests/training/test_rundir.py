"""The run directory: --restart deletes only what a run wrote, and one run at a time holds a directory.

Restart: a directory holding exactly a run's files is emptied (but kept, with its lock file); one more file
anywhere a run would not write it refuses the restart in one line naming it, with nothing deleted; the
current, home and root directories are refused whatever they hold.
Lock: a second process on a held directory is refused naming the holder's pid; a SIGKILLed holder's stale
lock file does not block the next run; in a multi-process run the main process's verdict stops every rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.run_files import write_config
from tandem_rlvr.config import load_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr import runlock
from tandem_rlvr.training import rundir

# everything a run writes in its directory (see the docstring of tandem_rlvr.training.rundir)
RUN_TREE = ["config.yaml", "metrics.jsonl", "preempted.json", "watchdog-rank0.txt", "watchdog-rank1.txt",
            ".metrics.jsonl.k2j3.tmp", ".config.yaml.x8.tmp", "run.lock",
            "checkpoints/step-2/model.safetensors", "checkpoints/step-4/COMPLETE", "checkpoints/.tmp-step-6/x",
            "checkpoints/.trash-step-1/y", "checkpoints/damaged-step-5/z", "checkpoints/damaged-step-5.1/z",
            "checkpoints/.step-4.old/w", "best/model.safetensors", "best/best.json", "final/model.safetensors",
            ".tmp-final/a", ".best.old/b", "tandem-rlvr/events.out.tfevents.1.host.2",
            "tandem-rlvr/1712/events.out.tfevents.3.host.4"]


@pytest.fixture(autouse=True)
def _deletions_stay_in_tmp(tmp_path, monkeypatch):
    """These tests point --restart at real directories (``/``, the current one): under a planted bug (a bare
    ``rmtree``) a deletion outside ``tmp_path`` must fail the test, never happen."""
    import shutil

    inside = tmp_path.resolve()
    real_rmtree, real_unlink, real_remove = shutil.rmtree, Path.unlink, os.remove

    def guard(path):
        resolved = Path(os.path.abspath(path)).resolve()
        if resolved != inside and inside not in resolved.parents:
            raise AssertionError(f"the test tried to delete {resolved}, outside its tmp_path")

    def rmtree(path, *a, **k):
        guard(path)
        return real_rmtree(path, *a, **k)

    def unlink(self, *a, **k):
        guard(self)
        return real_unlink(self, *a, **k)

    def remove(path, *a, dir_fd=None, **k):
        if dir_fd is None:
            guard(path)
        return real_remove(path, *a, dir_fd=dir_fd, **k)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(os, "remove", remove)
    monkeypatch.setattr(os, "unlink", remove)


def _make(root: Path, rel_paths) -> None:
    for rel in rel_paths:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_text() if p.is_file() and not p.is_symlink() else "<dir/link>")
            for p in sorted(root.rglob("*"))}


def _cfg(run: Path, *over):
    return load_config(None, ["model.senior=s", "model.junior=j", f"train.out_dir={run}", *over])


def _make_run(run: Path, rel_paths=RUN_TREE) -> None:
    """``rel_paths`` under ``run``, with the ``config.yaml`` a run writes (a restart refuses any other)."""
    from tandem_rlvr.config import save_config

    _make(run, rel_paths)
    save_config(_cfg(run), run / "config.yaml")


def test_restart_empties_a_directory_that_holds_only_a_runs_files(tmp_path):
    run = tmp_path / "run"
    _make_run(run)
    assert rundir.first_foreign(run) is None
    assert rundir.prepare(run, _cfg(run), restart=True) is None
    assert run.is_dir() and sorted(p.name for p in run.iterdir()) == ["config.yaml", "run.lock"]
    assert (run / "run.lock").read_text() == "run.lock"  # the (possibly held) lock file is never deleted


@pytest.mark.parametrize("foreign,named", [("data.csv", "data.csv"), ("checkpoints/notes.txt", "checkpoints/notes.txt"),
                                           ("tandem-rlvr/readme.md", "tandem-rlvr/readme.md"), (".aim/x", ".aim"),
                                           ("best.bak/model.safetensors", "best.bak"), ("final", "final"),
                                           ("checkpoints/step-3x/y", "checkpoints/step-3x")])
def test_restart_refuses_a_foreign_file_names_it_and_deletes_nothing(tmp_path, foreign, named):
    import shutil

    run = tmp_path / "run"
    _make(run, RUN_TREE)
    if foreign == "final":  # a file where a run writes a folder
        shutil.rmtree(run / "final")
    _make(run, [foreign])
    before = _tree(run)
    with pytest.raises(TandemError, match="--restart refused") as e:
        rundir.prepare(run, _cfg(run), restart=True)
    assert f"holds {str(run / named)!r}" in str(e.value) and "\n" not in str(e.value)
    assert _tree(run) == before


@pytest.mark.parametrize("files", [["samples.jsonl"], ["metrics.jsonl", "notes.txt"], ["config.yaml", "samples.jsonl"],
                                   ["data/train.jsonl"]])
def test_a_fresh_run_refuses_a_folder_that_holds_no_run_and_changes_nothing(tmp_path, files):
    """A fresh start (no checkpoint, no --restart) rewrites config.yaml and drops metrics.jsonl and samples.jsonl:
    a folder holding a user's files of those names without a run's config.yaml (or anything else) is refused."""
    run = tmp_path / "run"
    _make(run, files)
    before = _tree(run)
    with pytest.raises(TandemError, match="not a tandem-rlvr run's file") as e:
        rundir.prepare(run, _cfg(run), restart=False)
    assert "\n" not in str(e.value) and "train.out_dir" in str(e.value)
    assert _tree(run) == before


def test_a_fresh_run_starts_over_an_attempt_that_stopped_before_its_first_checkpoint(tmp_path):
    """The folder of an attempt killed before its first checkpoint (its config.yaml, metrics, samples, lock) is a
    run's own: a fresh start proceeds; an empty or missing folder too."""
    run = tmp_path / "run"
    cfg = _cfg(run)
    assert rundir.prepare(run, cfg, restart=False) is None  # missing folder
    (run / "samples.jsonl").write_text("{}\n")
    (run / "run.lock").write_text("")
    assert rundir.prepare(run, cfg, restart=False) is None
    assert (run / "config.yaml").is_file()


@pytest.mark.parametrize("left", [["checkpoints/damaged-step-4/model.safetensors"], ["final/model.safetensors"],
                                  ["best/model.safetensors", "best/best.json"]])
def test_a_run_that_cannot_be_resumed_is_not_started_over_without_restart(tmp_path, left):
    """No intact checkpoint, but the run went further than its metrics (its checkpoints all damaged, or a saved
    model and no checkpoint: ``train.save_every`` 0): a fresh start would retrain from step 0 over its metrics
    and models, so it is refused in one line and nothing changes; ``--restart`` starts over."""
    run = tmp_path / "run"
    cfg = _cfg(run)
    assert rundir.prepare(run, cfg, restart=False) is None
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    _make(run, left)
    before = _tree(run)
    with pytest.raises(TandemError, match="cannot be resumed") as e:
        rundir.prepare(run, cfg, restart=False)
    assert "--restart" in str(e.value) and left[0].split("/")[-2] in str(e.value) and "\n" not in str(e.value)
    assert _tree(run) == before
    assert rundir.prepare(run, cfg, restart=True) is None
    assert not (run / "metrics.jsonl").exists() and not (run / left[0]).exists()


def _best(run: Path, step: int) -> None:
    _make(run, ["best/model.safetensors", "checkpoints/.tmp-step-2/model.safetensors"])
    (run / "best" / "best.json").write_text(json.dumps({"metric": "val/pass@1", "value": 0.5, "step": step}))


def test_a_run_killed_between_best_and_its_first_checkpoint_starts_over(tmp_path):
    """best/ written by this run's validation before its first checkpoint (best.json's step and every metrics row
    up to the run's train.save_every): a fresh start retrains (and rewrites best/); a best/ of a later step (its
    checkpoints are gone) or of a run with another config is still refused, and nothing changes."""
    run = tmp_path / "run"
    cfg = _cfg(run, "train.save_every=2")
    assert rundir.prepare(run, cfg, restart=False) is None
    _best(run, step=2)  # val.every 2 == save_every: best/ at step 2, killed before step-2's checkpoint
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    assert rundir.prepare(run, cfg, restart=False) is None and (run / "best" / "best.json").is_file()
    with pytest.raises(TandemError, match=r"different config \(algo.lr") as e:
        rundir.prepare(run, _cfg(run, "train.save_every=2", "algo.lr=0.5"), restart=False)
    assert "\n" not in str(e.value)
    (run / "metrics.jsonl").unlink()  # killed before its first metrics row: best/ alone still names the run
    with pytest.raises(TandemError, match="different config"):
        rundir.prepare(run, _cfg(run, "train.save_every=2", "algo.lr=0.5"), restart=False)
    _best(run, step=4)  # past the first checkpoint, which is gone: retraining would lose it
    before = _tree(run)
    with pytest.raises(TandemError, match=r"cannot be resumed: it holds this run's saved model \(best/\)"):
        rundir.prepare(run, cfg, restart=False)
    assert _tree(run) == before


def test_the_same_run_directory_spelled_another_way_resumes(tmp_path, monkeypatch):
    """train.out_dir `run`, `run/` or the absolute path name one folder: not "a different config"."""
    monkeypatch.chdir(tmp_path)
    assert rundir.prepare(Path("run"), _cfg(Path("run")), restart=False) is None
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    for spelling in ("run/", str(tmp_path / "run"), "./run"):
        cfg = _cfg(Path("run"))
        cfg.train.out_dir = spelling
        assert rundir.prepare(Path(spelling), cfg, restart=False) is None


def test_restart_refuses_a_users_own_config_yaml_and_keeps_it(tmp_path):
    """A config the user keeps as train.out_dir/config.yaml (not every section of a run's): a fresh start
    refuses it as no run's file, and so does --restart, deleting nothing."""
    run = tmp_path / "run"
    _make(run, ["metrics.jsonl"])
    (run / "config.yaml").write_text("# my notes: keep this file\nmodel:\n  senior: s\n  junior: j\n")
    before = _tree(run)
    for call in (rundir.prepare, rundir.open_run):
        with pytest.raises(TandemError, match="--restart refused") as e:
            call(run, _cfg(run), restart=True)
        assert "config.yaml" in str(e.value) and "nothing was deleted" in str(e.value) and "\n" not in str(e.value)
    assert _tree(run) == before


@pytest.mark.parametrize("text,why", [("model:\n\tsenior: x\n", "cannot start any token at line 2"),
                                      ("- a\n", "holds a list, not a mapping"),
                                      (b"\xff\xfe", "can't decode")])
def test_a_damaged_run_config_is_one_line_naming_it(tmp_path, text, why):
    """A run's config.yaml edited by hand (bad YAML, not a mapping, not text) stops a resume in one line naming
    the file, with nothing changed."""
    run = tmp_path / "run"
    cfg = _cfg(run)
    assert rundir.prepare(run, cfg, restart=False) is None
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    config = run / "config.yaml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = _tree(run) if not isinstance(text, bytes) else None
    with pytest.raises(TandemError) as e:
        rundir.prepare(run, cfg, restart=False)
    assert str(config) in str(e.value) and why in str(e.value) and "\n" not in str(e.value)
    assert before is None or _tree(run) == before


def test_a_damaged_metrics_row_stops_the_resume_and_no_later_row_is_dropped(tmp_path):
    """A metrics row damaged in the middle (rows after it intact) stops a resume in one line naming the file and
    the line, with nothing changed: the rows after it were read as absent, and the resume wrote the short list
    back. A torn last row (a kill mid-append) is still cut off silently."""
    run = tmp_path / "run"
    cfg = _cfg(run)
    assert rundir.prepare(run, cfg, restart=False) is None
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2, "train/lo\n{"step": 3}\n{"step": 4}\n')
    before = _tree(run)
    for call in (lambda: rundir.prepare(run, cfg, restart=False), lambda: rundir.truncate_metrics(run, 4)):
        with pytest.raises(TandemError, match="line 2 is not a JSON object") as e:
            call()
        assert str(metrics) in str(e.value) and "\n" not in str(e.value)
        assert _tree(run) == before
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "train/lo')
    rundir.truncate_metrics(run, 3)
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_a_probe_file_of_a_preflight_killed_mid_check_blocks_no_rerun_and_no_restart(tmp_path, monkeypatch):
    """A kill between preflight's mkstemp and unlink leaves `.write-check-XXXX`: the project's own file, so
    the rerun starts and --restart deletes it (both refused it as foreign); a folder of that name is still foreign."""
    from tandem_rlvr import preflight

    run = tmp_path / "run"

    def killed(path, *a, **k):
        raise KeyboardInterrupt  # the kill, before the probe file is removed

    with monkeypatch.context() as m:
        m.setattr(preflight.os, "unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            preflight.check_writable(run, "train.out_dir")
    assert [p.name.startswith(".write-check-") for p in run.iterdir()] == [True]
    assert rundir.first_foreign(run) is None
    lock, resume_from = rundir.open_run(run, _cfg(run), restart=False)
    lock.release()
    assert resume_from is None and (run / "config.yaml").is_file()
    _make(run, ["metrics.jsonl", "checkpoints/.tmp-step-2/x"])  # then killed before its first checkpoint
    lock, _ = rundir.open_run(run, _cfg(run), restart=True)
    lock.release()
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "run.lock"]
    (run / ".write-check-abcd1234").mkdir()
    assert rundir.first_foreign(run) == run / ".write-check-abcd1234"


def test_aim_folder_is_a_runs_own_when_its_config_names_the_tracker(tmp_path):
    run = tmp_path / "run"
    _make(run, [".aim/meta/x", "metrics.jsonl"])
    (run / "config.yaml").write_text("train:\n  trackers: [aim]\n")
    assert rundir.first_foreign(run) is None
    (run / "config.yaml").write_text("train:\n  trackers: [tensorboard]\n")
    assert rundir.first_foreign(run) == run / ".aim"


def test_restart_refuses_a_symbolic_link_and_keeps_its_target(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "precious"
    _make(run, ["config.yaml"])
    _make(elsewhere, ["thesis.tex"])
    (run / "best").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(TandemError, match="best"):
        rundir.prepare(run, _cfg(run), restart=True)
    assert (elsewhere / "thesis.tex").read_text() == "thesis.tex" and (run / "config.yaml").exists()


@pytest.mark.parametrize("which", [".", "cwd", "..", "home", "/"])
def test_restart_never_deletes_the_current_home_or_root_directory(tmp_path, monkeypatch, which):
    """Defence in depth (the config refuses these out_dirs too): even a directory holding only run files is
    refused when it is, or holds, the current or the home directory."""
    work, home = tmp_path / "work", tmp_path / "home"
    _make(work, ["config.yaml", "metrics.jsonl"])
    _make(home, ["config.yaml"])
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    target = {".": Path("."), "cwd": work, "..": Path(".."), "home": home, "/": Path("/")}[which]
    before = _tree(tmp_path)
    cfg = _cfg(tmp_path / "elsewhere")
    cfg.train.out_dir = str(target)  # as a caller that skipped the config's own check would pass it
    with pytest.raises(TandemError, match="refused"):
        rundir.prepare(target, cfg, restart=True)
    with pytest.raises(TandemError, match="refused"):
        rundir.open_run(target, cfg, restart=True)
    assert _tree(tmp_path) == before


def test_cli_restart_with_a_users_file_exits_2_in_one_line_and_keeps_everything(tmp_path, model_dirs, capsys):
    from tandem_rlvr.cli import main

    cfg = write_config(tmp_path, model_dirs, steps=1, save_every=0)
    run = tmp_path / "run"
    _make(run, ["config.yaml", "metrics.jsonl", "checkpoints/step-1/COMPLETE", "results.csv"])
    before = _tree(run)
    assert main(["train", str(cfg), "--restart"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "results.csv" in err and "nothing was deleted" in err
    assert _tree(run) == before


# -- the lock ---------------------------------------------------------------------------------------

_HOLD = """
import sys, time
from tandem_rlvr import runlock
lock = runlock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(run: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(runlock.__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "locked", "the holder process did not take the lock"
    return p


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


def test_a_second_process_is_refused_naming_the_holder_and_a_killed_holder_never_blocks(tmp_path):
    run = tmp_path / "run"
    p = _holder(run)
    try:
        with pytest.raises(runlock.RunLocked, match=f"pid {p.pid} on host ") as e:
            runlock.acquire(run)
        assert "\n" not in str(e.value) and "run.lock" in str(e.value)
    finally:
        _kill(p)
    assert str(p.pid) in (run / "run.lock").read_text()  # the stale file of a SIGKILLed holder stays ...
    with runlock.acquire(run):  # ... and does not block the next run, which writes its own name
        assert f'"pid": {os.getpid()}' in (run / "run.lock").read_text()
    with runlock.acquire(run):  # released: taken again
        pass


def test_a_run_lock_symlink_is_never_written_through(tmp_path):
    """run.lock a symbolic link (to a user's file) or a folder: refused in one line naming it, nothing changed."""
    run, precious = tmp_path / "run", tmp_path / "important.txt"
    precious.write_text("precious user text")
    run.mkdir()
    (run / "run.lock").symlink_to(precious)
    for call in (lambda: runlock.acquire(run), lambda: rundir.open_run(run, _cfg(run), restart=False)):
        with pytest.raises(TandemError, match="holds 'run.lock', which is not a lock file a run wrote") as e:
            call()
        assert "symbolic link" in str(e.value) and "\n" not in str(e.value)
    assert precious.read_text() == "precious user text" and (run / "run.lock").is_symlink()
    (run / "run.lock").unlink()
    (run / "run.lock").mkdir()
    with pytest.raises(TandemError, match="which is not a lock file"):
        runlock.acquire(run)


@pytest.mark.parametrize("text", ["my notes\n", '{"pid": 12}\n', '["pid", "host", "started"]', "\x00\xff"])
def test_a_users_own_run_lock_file_is_never_overwritten(tmp_path, text):
    """A regular file named run.lock that holds anything but a run's holder record (or nothing) is refused in one
    line, its text untouched; a killed run's record and an empty file are still taken (tested above and below)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.lock").write_bytes(text.encode("latin-1"))
    for call in (lambda: runlock.acquire(run), lambda: rundir.open_run(run, _cfg(run), restart=False)):
        with pytest.raises(TandemError, match="its text is not a run's holder record") as e:
            call()
        assert "\n" not in str(e.value) and "nothing was changed" in str(e.value)
        assert (run / "run.lock").read_bytes() == text.encode("latin-1")
    assert sorted(os.listdir(run)) == ["run.lock"]


def test_a_refused_run_leaves_a_foreign_folder_without_a_lock_file(tmp_path):
    """A fresh run refused in a user's folder removes the run.lock it created (and only that one)."""
    run = tmp_path / "data"
    _make(run, ["notes.txt"])
    before = _tree(run)
    with pytest.raises(TandemError, match="not a tandem-rlvr run's file"):
        rundir.open_run(run, _cfg(run), restart=False)
    assert _tree(run) == before
    (run / "run.lock").write_text("")  # one that was there stays (it may be another process's lock file)
    with pytest.raises(TandemError, match="not a tandem-rlvr run's file"):
        rundir.open_run(run, _cfg(run), restart=False)
    assert (run / "run.lock").exists()
    with runlock.acquire(run):  # and the lock is free again
        pass


def test_a_second_run_on_a_held_directory_deletes_nothing_even_with_restart(tmp_path, model_dirs, capsys):
    from tandem_rlvr.cli import main

    cfg = write_config(tmp_path, model_dirs, steps=1, save_every=0)
    run = tmp_path / "run"
    _make_run(run, ["metrics.jsonl", "checkpoints/step-1/COMPLETE"])
    p = _holder(run)
    try:
        before = _tree(run)
        assert main(["train", str(cfg), "--restart"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"pid {p.pid}" in err and "in use by another run" in err
        assert _tree(run) == before
    finally:
        _kill(p)


def test_the_lock_is_held_for_the_whole_run_and_released_after_it(tmp_path, model_dirs, monkeypatch):
    """Seen from another process while the run trains: the directory is locked; after train() returns it is free."""
    import yaml

    from tandem_rlvr.training import trainer as trainer_mod

    cfg_path = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"},
                            steps=2, save_every=0)
    cfg = load_config(str(cfg_path), [])
    run, seen = tmp_path / "run", []
    real_step = trainer_mod.Trainer.train_step

    def step_and_probe(self, step):
        probe = subprocess.run([sys.executable, "-c", "import sys; from tandem_rlvr import runlock; "
                                "runlock.acquire(sys.argv[1])", str(run)], capture_output=True, text=True,
                               env=dict(os.environ, PYTHONPATH=str(Path(runlock.__file__).parents[2])))
        seen.append(f"pid {os.getpid()}" in probe.stderr and probe.returncode != 0)
        return real_step(self, step)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_and_probe)
    trainer_mod.train(cfg)
    assert seen == [True, True]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 2
    with runlock.acquire(run):
        pass


class _Rank:
    """The accelerator of one rank of a two-process run (what _prepare_run_dir reads of it)."""

    def __init__(self, rank: int):
        self.process_index, self.num_processes, self.is_main_process = rank, 2, rank == 0


def _broadcast_to(sent: list):
    """A stand-in for ``broadcast_object_list`` over two ranks called in turn: rank 0 sends first (its objects
    land in ``sent``); the other rank receives what it sent."""
    def broadcast(objs, from_process=0):
        if not sent:
            sent.append(list(objs))
        else:
            objs[:] = sent[0]
        return objs
    return broadcast


def test_every_rank_stops_with_the_main_processs_lock_verdict(tmp_path, monkeypatch):
    """Rank 0 takes the lock (or is refused); what it found is broadcast, so every rank raises the same line
    and no rank but the main one touches the directory."""
    import accelerate.utils

    from tandem_rlvr.training import build

    run = tmp_path / "run"
    cfg = _cfg(run)
    sent: list = []

    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", _broadcast_to(sent))
    p = _holder(run)
    try:
        errors = []
        for rank in (0, 1):
            with pytest.raises(TandemError) as e:
                build._prepare_run_dir(_Rank(rank), cfg, restart=False)
            errors.append(str(e.value))
        assert errors[0] == errors[1] and f"pid {p.pid}" in errors[0]
    finally:
        _kill(p)
    sent.clear()
    lock, resume = build._prepare_run_dir(_Rank(0), cfg, restart=False)  # free now: rank 0 holds it
    assert isinstance(lock, runlock.RunLock) and resume is None and sent == [[None, None]]
    assert build._prepare_run_dir(_Rank(1), cfg, restart=False) == (None, None)  # other ranks hold nothing
    lock.release()


def test_every_rank_takes_the_main_processs_checkpoint_and_error(tmp_path, monkeypatch):
    """Rank 0's decision is broadcast: the other ranks resume from the checkpoint it chose (never one they find
    themselves: a shared file system may show them another) and stop on any error it met, which rank 0 raises
    itself as it was."""
    import accelerate.utils

    from tandem_rlvr.training import build

    run, cfg, sent, chosen = tmp_path / "run", _cfg(tmp_path / "run"), [], tmp_path / "run" / "checkpoints" / "step-4"

    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", _broadcast_to(sent))
    monkeypatch.setattr(rundir, "open_run", lambda *a: ("lock", chosen))
    assert build._prepare_run_dir(_Rank(0), cfg, restart=False) == ("lock", chosen)
    assert build._prepare_run_dir(_Rank(1), cfg, restart=False) == (None, chosen)  # nothing at run/ here
    sent.clear()

    def fail(*a):
        raise PermissionError(13, "Permission denied", str(run / "config.yaml"))

    monkeypatch.setattr(rundir, "open_run", fail)
    with pytest.raises(PermissionError):
        build._prepare_run_dir(_Rank(0), cfg, restart=False)
    with pytest.raises(TandemError, match="main process failed to prepare the run directory") as e:
        build._prepare_run_dir(_Rank(1), cfg, restart=False)
    assert "Permission denied" in str(e.value) and "config.yaml" in str(e.value)


@pytest.mark.slow
def test_two_launched_processes_both_refuse_a_held_directory(tmp_path, model_dirs):
    """A real two-process launch (accelerate, gloo) on a directory another process holds: both ranks exit,
    the launcher fails, the message names the holder, and nothing in the directory changed."""
    import shutil

    from helpers.paths import TESTS
    from helpers.processes import free_port

    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=1,
                       save_every=0)
    run = tmp_path / "run"
    _make_run(run, ["metrics.jsonl"])
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "tandem_rlvr", "train", str(cfg),
           "--restart"]
    p = _holder(run)
    try:
        before = _tree(run)
        t0 = time.monotonic()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode != 0, res.stderr[-2000:]
        assert res.stderr.count(f"in use by another run (pid {p.pid}") == 2, res.stderr[-3000:]  # one line per rank
        assert _tree(run) == before and time.monotonic() - t0 < 300
    finally:
        _kill(p)


def test_the_demo_clears_a_killed_jobs_run_directory_under_the_same_rules(tmp_path):
    """The parallel demo empties each job's run directory before it starts (so leftovers do not count as
    progress): only a run's own files; a foreign one stops the demo naming it, before any job starts."""
    from tandem_rlvr.demo.jobs import JobContext, run_parallel

    out = tmp_path / "demo"
    _make(out / "runs" / "trlvr-seed0", ["config.yaml", "metrics.jsonl", "checkpoints/step-2/COMPLETE", "mine.txt"])
    before = _tree(out)
    with pytest.raises(TandemError, match="mine.txt"):
        next(run_parallel(JobContext("senior", None, plan=None, out=str(out)), [("trlvr", 0)], 1))
    assert _tree(out) == before


def test_a_real_runs_directory_is_all_its_own_so_restart_works(tmp_path, model_dirs):
    """What a run really writes (checkpoints, best/ from validation, final/, TensorBoard's folder, the lock) is
    all recognised as the run's own: --restart on it succeeds, and a preempted run's marker is its own too."""
    import yaml

    from tandem_rlvr.cli import main

    pytest.importorskip("tensorboard")
    cfg = write_config(tmp_path, model_dirs, data={"reward": "helpers.rewards_for_tests:length_reward"}, steps=2,
                       save_every=1, trackers=["tensorboard"])
    c = yaml.safe_load(cfg.read_text())
    c["val"] = {"data": c["data"]["train"], "every": 1, "n": 2, "limit": 2, "select": "pass@2"}
    cfg.write_text(yaml.safe_dump(c))
    assert main(["train", str(cfg)]) == 0
    run = tmp_path / "run"
    names = {p.name for p in run.iterdir()}
    assert {"best", "final", "checkpoints", "tandem-rlvr", "run.lock", "metrics.jsonl", "config.yaml"} <= names, names
    (run / "preempted.json").write_text("{}")
    assert rundir.first_foreign(run) is None
    assert main(["train", str(cfg), "--restart"]) == 0
