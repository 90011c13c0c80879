"""The demo's --out and world: it never replaces another demo's results, files it did not write, or a run a live
process trains; it resumes only on the same world build, and its report says when the world is not the shipped
build. The demo runs here use a tiny plan (1 seed, 1 step, 2 problems; ~5 s each)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tandem_rlvr.demo.plan import QUICK, DemoPlan
from tandem_rlvr.errors import TandemError

TINY = DemoPlan(**{**QUICK.__dict__, "steps": 1, "val_every": 0, "select": "", "kl_betas": (), "eval_problems": 2,
                   "eval_n": 1, "curve_ps": (1.0,), "prompts_per_step": 2, "group_size": 2})


@pytest.fixture()
def cache(world, monkeypatch):
    """The session's installed shipped world as the demo's cache (read only here)."""
    paths, _ = world
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
    return paths


def _demo(out, **kw):
    from tandem_rlvr.demo import run_demo

    return run_demo(out, **{"workers": 1, "plan": TINY, **kw})


def _simulate_rebuild(root: Path) -> None:
    """What ``--rebuild-world`` leaves in the cache on a machine that rounds differently from the one that built the
    shipped copy: a complete, verified build of the same recipe with other weights."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from tandem_rlvr.world import build

    f = root / "senior" / "model.safetensors"
    with safe_open(str(f), "pt") as h:
        meta = h.metadata()
    gen = torch.Generator().manual_seed(0)
    sd = {k: (v + 0.05 * torch.randn(v.shape, generator=gen)) if v.is_floating_point() else v
          for k, v in load_file(str(f)).items()}
    save_file(sd, str(f), metadata=meta)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"] = build._file_table(root)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    assert build.is_complete(root)


# -- 1. a demo into an --out that holds an earlier demo of another plan -------------------------------------------


def test_a_demo_with_another_plan_does_not_discard_the_previous_demo(cache, tmp_path):
    """`bash scripts/demo.sh` (the full demo, default --out demo_out), then `tandem-rlvr demo --quick` (same default
    --out): the second run must not silently delete the first one's results, chains and trained runs."""
    out = tmp_path / "demo_out"
    _demo(out)
    first = (out / "results.json").read_text()
    final = out / "runs" / "grpo-seed0" / "final"
    assert final.is_dir()
    try:
        _demo(out, plan=replace(TINY, steps=2))  # another plan, no --restart
    except TandemError:
        return  # refused, naming the earlier demo: fine
    kept = any(p.read_text() == first for p in out.rglob("results*.json"))
    assert kept, "the earlier demo's results.json was overwritten without --restart (only an INFO line said so)"


# -- 2. a demo into a folder with the user's own files ------------------------------------------------------------


def test_demo_does_not_overwrite_files_it_did_not_write(cache, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "report.md").write_text("my own notes\n")
    (out / "results.json").write_text(json.dumps({"my": "experiment"}))
    try:
        _demo(out)
    except TandemError:
        pass  # refused, naming the file: fine
    assert (out / "report.md").read_text() == "my own notes\n"
    assert json.loads((out / "results.json").read_text()) == {"my": "experiment"}


def test_a_results_json_that_is_not_a_demos_is_one_clear_error(cache, tmp_path, capsys):
    from tandem_rlvr.cli import main

    out = tmp_path / "d"
    out.mkdir()
    (out / "results.json").write_text("[1, 2]\n")
    rc = main(["demo", "--quick", "--workers", "1", "--out", str(out)])  # was: AttributeError, a traceback
    assert rc == 2
    assert "results.json" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "[1, 2]\n"


# -- 3. the world a demo resumes on, and the report's word on it --------------------------------------------------


def test_resume_after_the_world_was_rebuilt_does_not_keep_the_old_worlds_evaluations(world, tmp_path, monkeypatch):
    from tandem_rlvr.world.build import build_world

    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(tmp_path / "cache"))
    paths = build_world(progress=False)
    out = tmp_path / "d"
    first = _demo(out)
    _simulate_rebuild(paths.root)  # e.g. `tandem-rlvr demo --rebuild-world` after the demo was killed
    before = (out / "results.json").read_text()
    with pytest.raises(TandemError, match="world build"):  # was: resumed, two worlds' results in one report
        _demo(out)
    assert (out / "results.json").read_text() == before
    second = _demo(out, restart=True)
    assert not second.get("resumed") and second["world"]["build"] != first["world"]["build"]
    assert second["warm_start"] != first["warm_start"]


def test_the_report_says_when_the_cached_world_is_not_the_shipped_build(world, tmp_path, monkeypatch):
    """After one `--rebuild-world`, every later plain `tandem-rlvr demo` uses the rebuild; the README says the demo's
    numbers are the shipped world's, so the report must say it is another build."""
    from tandem_rlvr.world.build import build_world

    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(tmp_path / "cache"))
    _simulate_rebuild(build_world(progress=False).root)
    out = tmp_path / "d"
    _demo(out)
    report = (out / "report.md").read_text()
    assert "not the shipped build" in report


def test_world_seed_of_the_shipped_build_is_not_reported_as_a_rebuild(cache, tmp_path):
    from tandem_rlvr.world.rules import SEED

    out = tmp_path / "d"
    _demo(out, world_seed=SEED)  # the shipped world is used (build_world takes the prebuilt copy for SEED)
    report = (out / "report.md").read_text()
    assert "not the shipped build" not in report, report.splitlines()[2]


# -- 4. two demos in one --out --------------------------------------------------------------------------------------


def _hold_lock_elsewhere(run: Path):
    """Another process that holds ``run``'s lock (as a second demo's job training it would) until killed."""
    import subprocess
    import sys

    code = ("import sys, time; from tandem_rlvr import runlock; held = runlock.acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_demo_does_not_clear_a_run_another_process_is_training(cache, tmp_path, monkeypatch):
    """`clear_run` of a job's leftovers deleted a run that another live demo was training in the same --out."""
    import concurrent.futures

    from tandem_rlvr.demo import jobs
    from tandem_rlvr.runlock import RunLocked

    out = tmp_path / "d"
    run = out / "runs" / "grpo-seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    holder = _hold_lock_elsewhere(run)

    class NoPool:
        def __init__(self, *a, **k):
            raise RuntimeError("no pool in this test")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", NoPool)
    ctx = jobs.JobContext(str(cache.senior_dir), str(cache.junior_dir), TINY, str(out))
    try:
        with pytest.raises(RunLocked):
            list(jobs.run_parallel(ctx, [("grpo", 0)], 2))
        assert (run / "metrics.jsonl").is_file(), "the live run's metrics.jsonl was deleted under its lock"
    finally:
        holder.kill()
        holder.wait()


def test_a_second_demo_into_the_same_out_is_refused(cache, tmp_path):
    """Two demos into one --out rewrote each other's results.json: the whole demo holds the folder's lock."""
    from tandem_rlvr.runlock import RunLocked

    out = tmp_path / "d"
    out.mkdir()
    holder = _hold_lock_elsewhere(out)
    try:
        with pytest.raises(RunLocked):
            _demo(out)
        assert not (out / "results.json").exists()
    finally:
        holder.kill()
        holder.wait()


def _old_version_results(out: Path, paths) -> dict:
    """A finished demo's results.json as the version before world builds were recorded wrote it."""
    first = _demo(out)
    old = json.loads((out / "results.json").read_text())
    del old["world"]["build"], old["world"]["shipped"]
    (out / "results.json").write_text(json.dumps(old))
    return first


def test_a_demo_of_an_older_version_without_a_world_build_still_resumes(cache, tmp_path, caplog):
    out = tmp_path / "d"
    first = _old_version_results(out, cache)
    again = _demo(out)  # was refused: "another world build" (old results have none)
    assert again.get("resumed") and again["warm_start"] == first["warm_start"]
    assert "older version" in caplog.text


def test_a_results_json_whose_world_is_not_a_mapping_is_one_clear_error(cache, tmp_path):
    out = tmp_path / "d"
    _demo(out)
    data = json.loads((out / "results.json").read_text())
    data["world"] = None
    (out / "results.json").write_text(json.dumps(data))
    with pytest.raises(TandemError, match="not a demo's results"):  # was: TypeError, a traceback
        _demo(out)


def test_rebuild_world_over_a_demo_is_refused_before_the_rebuild(cache, tmp_path, monkeypatch):
    from tandem_rlvr.world import build

    out = tmp_path / "d"
    _demo(out)
    monkeypatch.setattr(build, "build_world", lambda *a, **k: pytest.fail("the world was rebuilt before the refusal"))
    with pytest.raises(TandemError, match="--rebuild-world"):
        _demo(out, force_world=True)


def test_the_second_demos_refusal_names_the_demos_option(cache, tmp_path):
    from tandem_rlvr.runlock import RunLocked

    out = tmp_path / "d"
    out.mkdir()
    holder = _hold_lock_elsewhere(out)
    try:
        with pytest.raises(RunLocked, match="another demo.*--out"):
            _demo(out)
    finally:
        holder.kill()
        holder.wait()


# -- 4. --restart checks every run folder before it clears any ------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_a_restart_refused_by_one_run_folder_clears_no_other(cache, tmp_path, workers):
    """A user's file in the last run folder: the refusal must come before the other runs are cleared (they were,
    one job at a time, while the message said nothing was deleted; the old results.json then pointed at empty
    runs). And preflight's probe file left by a process killed mid-check is the demo's own, not the user's."""
    out = tmp_path / "d"
    _demo(out)
    runs = sorted(p for p in (out / "runs").iterdir())
    assert len(runs) >= 2
    (runs[-1] / "mine.txt").write_text("my analysis")
    def files():  # every file of every run, with its modification time (a cleared and retrained run has new ones)
        return {str(f): f.stat().st_mtime_ns for f in (out / "runs").rglob("*") if f.is_file()}

    before = files()
    with pytest.raises(TandemError, match="mine.txt"):
        _demo(out, restart=True, workers=workers)
    assert files() == before
    (runs[-1] / "mine.txt").unlink()
    (out / ".write-check-abcd1234").write_text("")
    from tandem_rlvr.demo.runner import _check_own

    (out / ".tandem-rlvr-demo").unlink()
    _check_own(out)  # the probe file alone does not make the folder foreign
