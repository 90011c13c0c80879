"""Checkpoints are what they claim: no checksums.json means not loaded (until someone vouches for it), only the
files checksums.json lists are loaded, and every rename that publishes something is followed by an fsync of
its folder (best/best.json being inside best/ before it is published: tests/training/test_best_checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers.run_files import write_config
from helpers.tiny_models import make_tiny_model
from tandem_rlvr import integrity, io
from tandem_rlvr.errors import TandemError
from tandem_rlvr.training import checkpoint as ck


def _parts(tokenizer, seed=0):
    model = make_tiny_model(len(tokenizer), seed, 16, layers=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _save(run: Path, step: int, tokenizer, seed=0) -> Path:
    model, opt, sched = _parts(tokenizer, seed)
    return ck.save_checkpoint(run, step, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                              trainer_state={}, keep_last=5)


def _load(ckpt: Path, tokenizer, **kw) -> dict:
    model, opt, sched = _parts(tokenizer, seed=7)
    state = ck.load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, **kw)
    state["model"] = model
    return state


def test_a_checkpoint_without_checksums_is_not_loaded_until_vouched_for(tmp_path, tokenizer, capsys):
    run = tmp_path / "run"
    ckpt = _save(run, 1, tokenizer)
    (ckpt / integrity.SUMS).unlink()
    with pytest.raises(integrity.Unverified, match=f"{ckpt}.*no checksums.json.*vouch"):
        ck.newest_intact_checkpoint(run)
    assert ckpt.is_dir()  # not moved aside: nothing says it is damaged, the user decides
    with pytest.raises(integrity.Unverified):
        _load(ckpt, tokenizer)
    # the user says so: for a library caller an argument, for everyone the vouch command
    assert ck.newest_intact_checkpoint(run, trust_unverified=True) == ckpt
    assert _load(ckpt, tokenizer, trust_unverified=True)["step"] == 1
    assert integrity.main(["vouch", str(ckpt)]) == 0
    assert ck.newest_intact_checkpoint(run) == ckpt and integrity.damage(ckpt) is None
    assert _load(ckpt, tokenizer)["step"] == 1
    assert integrity.main(["vouch", str(ckpt)]) == 2  # already has checksums: nothing re-recorded
    assert integrity.main(["vouch", str(tmp_path)]) == 2  # not a checkpoint
    assert "not a complete checkpoint" in capsys.readouterr().err


def test_an_unlisted_weight_file_is_named_and_never_loaded(tmp_path, tokenizer):
    """A second writer's weight file in a checkpoint whose listed files all verify (a mixed checkpoint): the
    resume names it and falls back to the previous checkpoint; a direct load refuses it."""
    run = tmp_path / "run"
    older = _save(run, 1, tokenizer, seed=0)
    newest = _save(run, 2, tokenizer, seed=1)
    other = make_tiny_model(len(tokenizer), 5, 16, layers=1).state_dict()
    save_file({k: v.clone().contiguous() for k, v in other.items() if k != "lm_head.weight"},
              str(newest / "model-00002-of-00002.safetensors"))
    with pytest.raises(TandemError, match="model-00002-of-00002.safetensors is not listed in checksums.json"):
        _load(newest, tokenizer)
    assert "model-00002-of-00002.safetensors is not listed" in integrity.damage(newest)
    assert ck.newest_intact_checkpoint(run) == older
    assert (run / "checkpoints" / "damaged-step-2").is_dir()
    (older / "lora_state.pt").write_bytes(b"x")  # a state file load_checkpoint would read is held to the same rule
    with pytest.raises(TandemError, match="lora_state.pt is not listed"):
        _load(older, tokenizer)


def test_only_the_listed_weight_files_are_read(tmp_path, tokenizer, monkeypatch):
    run = tmp_path / "run"
    ckpt = _save(run, 1, tokenizer)
    read = []
    import safetensors.torch

    real = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda f, *a, **k: read.append(Path(f).name) or real(f, *a, **k))
    _load(ckpt, tokenizer)
    listed = integrity.listed_files(ckpt)
    assert read and all(name in listed for name in read)


def test_cli_resume_of_an_unverified_checkpoint_exits_2_in_one_line_then_runs_once_vouched(tmp_path, model_dirs, capsys):
    from tandem_rlvr.cli import main

    reward = {"reward": "helpers.rewards_for_tests:length_reward"}
    cfg = write_config(tmp_path, model_dirs, data=reward, steps=1, save_every=1)
    assert main(["train", str(cfg)]) == 0
    ckpt = tmp_path / "run" / "checkpoints" / "step-1"
    (ckpt / integrity.SUMS).unlink()
    capsys.readouterr()
    cfg = write_config(tmp_path, model_dirs, data=reward, steps=2, save_every=1)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checksums.json" in err and str(ckpt) in err
    assert integrity.main(["vouch", str(ckpt)]) == 0
    assert main(["train", str(cfg)]) == 0
    assert (tmp_path / "run" / "checkpoints" / "step-2" / integrity.SUMS).is_file()


def test_every_rename_that_publishes_is_followed_by_an_fsync_of_its_folder(tmp_path, tokenizer, monkeypatch):
    """Recorded at the OS calls: after each os.replace the next fsync is of the destination's folder."""
    events: list[tuple[str, Path]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst, *a, **k):
        real_replace(src, dst, *a, **k)
        events.append(("replace", Path(os.path.abspath(dst)).parent))

    def fsync(fd):
        real_fsync(fd)
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}"))))

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    run = tmp_path / "run"
    io.atomic_write_json(run / "a.json", {"x": 1})
    model, opt, sched = _parts(tokenizer)
    for step in (1, 1, 2):  # a new checkpoint, the same step again (replaced via .step-1.old), a prune (to .trash-*)
        ck.save_checkpoint(run, step, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                           trainer_state={}, keep_last=1)
    ck.save_model(model, tokenizer, run / "best", extra_json={"best.json": {"step": 2}})
    ck.save_model(model, tokenizer, run / "best", extra_json={"best.json": {"step": 3}})
    integrity.move_aside(run / "checkpoints" / "step-2")
    from tandem_rlvr.world.build import _install  # the world build's models, installed into the cache

    for _ in range(2):  # new, then replacing the old one
        (tmp_path / "world.tmp").mkdir()
        _install(tmp_path / "world.tmp", tmp_path / "world")
    replaces = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    assert len(replaces) >= 10
    synced = {where for kind, where in events if kind == "fsync"}
    published = [p for p in (run / "best", run / "checkpoints" / "step-1") if p.is_dir()]
    for folder in published:  # every file's contents were synced (under its temporary name) before publishing
        for f in folder.rglob("*"):
            if f.is_file():
                tmp_name = Path(str(f).replace(f"/{folder.name}/", f"/.tmp-{folder.name}/", 1))
                assert tmp_name in synced, f"{f.name} of {folder.name} published without an fsync of its contents"
    for i in replaces:
        following = next((where for kind, where in events[i + 1:] if kind == "fsync"), None)
        assert following == events[i][1], f"rename into {events[i][1]} not followed by an fsync of it (next: {following})"


def test_each_process_resumes_with_its_own_random_state(tmp_path, tokenizer, caplog):
    """A checkpoint of a 2-process run holds both processes' RNG states: each resumes with its own (dropout
    masks as in an uninterrupted run). Resumed by another number of processes, every process takes the main
    one's, with a warning; a one-process checkpoint keeps its one state."""
    import logging
    import random

    states = []
    for seed in (11, 22):  # what the two processes' generators hold at the save
        torch.manual_seed(seed)
        random.seed(seed)
        states.append(ck.rng_state())
    model, opt, sched = _parts(tokenizer)
    ckpt = ck.save_checkpoint(tmp_path / "run", 3, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                              trainer_state={}, keep_last=5, rng_states=states)

    def resumed(rank, n):
        torch.manual_seed(99)
        random.seed(99)
        _load(ckpt, tokenizer, rank=rank, num_processes=n)
        return torch.rand(3), random.random()

    def drawn(seed):
        torch.manual_seed(seed)
        random.seed(seed)
        return torch.rand(3), random.random()

    for rank, seed in ((0, 11), (1, 22)):
        got, want = resumed(rank, 2), drawn(seed)
        assert torch.equal(got[0], want[0]) and got[1] == want[1], f"process {rank}"
    caplog.set_level(logging.WARNING)
    for rank in (0, 2):  # the main process says so, once
        got, want = resumed(rank, 3), drawn(11)
        assert torch.equal(got[0], want[0]) and got[1] == want[1], f"process {rank} of 3"
    assert caplog.text.count("random states of 2 process(es), this run has 3") == 1
    one = ck.save_checkpoint(tmp_path / "one", 1, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                             trainer_state={}, keep_last=5, rng_states=states[1:])
    torch.manual_seed(99)
    _load(one, tokenizer)
    assert torch.equal(torch.rand(3), drawn(22)[0])


@pytest.mark.parametrize("new_complete", [True, False])
def test_a_replacement_cut_between_its_two_renames_is_finished_on_resume(tmp_path, tokenizer, new_complete):
    """Saving step-2 (or best/) again moves the old copy to ``.step-2.old``, then the new one from ``.tmp-step-2``
    into place. A kill between the two left neither named ``step-2``, and a prune would have deleted the new copy:
    the resume puts the new copy in place when it is complete, else the old one back."""
    import shutil

    from tandem_rlvr.config import load_config, save_config
    from tandem_rlvr.training import rundir

    run, other = tmp_path / "run", tmp_path / "other"
    pairs = []
    for seed, where in ((0, run), (1, other)):  # the old copies in run/, the new (other weights) in other/
        model, _opt, _sched = _parts(tokenizer, seed)
        pairs.append((_save(where, 2, tokenizer, seed),
                      ck.save_model(model, tokenizer, where / "best", extra_json={"best.json": {"step": 2}})))
    for final, new in zip(*pairs):  # the state a kill between publish_dir's two renames leaves
        tmp = final.with_name(f".tmp-{final.name}")
        shutil.copytree(new, tmp)
        if not new_complete:
            (tmp / ck.MARKER).unlink()
        final.rename(final.with_name(f".{final.name}.old"))
    weights = {f: (n / "model.safetensors").read_bytes() for f, n in zip(*pairs)}
    old_weights = {f: (f.with_name(f".{f.name}.old") / "model.safetensors").read_bytes() for f in pairs[0]}
    cfg = load_config(None, ["model.senior=s", "model.junior=j", f"train.out_dir={run}"])
    save_config(cfg, run / "config.yaml")
    assert rundir.prepare(run, cfg, restart=False) == pairs[0][0]
    for final in pairs[0]:
        want = weights[final] if new_complete else old_weights[final]
        assert (final / "model.safetensors").read_bytes() == want and (final / ck.MARKER).exists()
        assert not final.with_name(f".{final.name}.old").exists()


def test_an_fp16_runs_loss_scale_is_saved_and_resumed(tmp_path, tokenizer):
    """fp16 mixed precision (a V100, a T4): accelerate's optimizer carries a GradScaler whose scale backs off on
    overflows; a resumed run went on from a fresh 2^16 instead of the scale it had reached, skipping updates an
    uninterrupted run makes."""
    from types import SimpleNamespace

    model, opt, sched = _parts(tokenizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    scaler.scale(torch.ones(()))  # the scaler's state starts at its first scaled loss
    scaler.update(2.0 ** 13)  # where three overflows would have left it
    wrapped = SimpleNamespace(state_dict=opt.state_dict, load_state_dict=opt.load_state_dict, scaler=scaler)
    ckpt = ck.save_checkpoint(tmp_path / "run", 2, model=model, tokenizer=tokenizer, optimizer=wrapped,
                              scheduler=sched, trainer_state={})
    model2, opt2, sched2 = _parts(tokenizer, seed=7)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    resumed = SimpleNamespace(state_dict=opt2.state_dict, load_state_dict=opt2.load_state_dict, scaler=fresh)
    ck.load_checkpoint(ckpt, model=model2, optimizer=resumed, scheduler=sched2)
    assert fresh.get_scale() == 2.0 ** 13
    ck.load_checkpoint(ckpt, model=model2, optimizer=opt2, scheduler=sched2)  # no scaler (bf16, float32): as before
