"""The rollout's chunks across process counts: a chunk's seed and padding follow its global position, so a
run equals itself on any number of processes exactly where each process's share of a mini-batch holds whole
chunks; ``dist.chunk_note`` says so where it does not (the shipped 2-node launch with the paper's config)."""

from types import SimpleNamespace

import pytest

from tandem_rlvr.training.dist import chunk_note
from tandem_rlvr.training.trainer import Trainer


def _chunks(prompts_per_step, mini_batch, batch_size, group, n):
    """Every process's chunks of step 0 as (first global position, positions), as ``Trainer.rollout`` cuts them."""
    out = set()
    for r in range(n):
        cfg = SimpleNamespace(mini_batch_prompts=lambda: mini_batch)
        fake = SimpleNamespace(cfg=cfg, acc=SimpleNamespace(num_processes=n, process_index=r),
                               _step_prompts=lambda step: list(range(prompts_per_step)))
        local = Trainer._local_prompts(fake, 0)
        size = max(1, batch_size // group if batch_size else len(local))
        for c in range(0, len(local), size):
            chunk = local[c:c + size]
            out.add((chunk[0][0], tuple(g for g, _ in chunk)))
    return out


@pytest.mark.parametrize("steps_prompts,mini,batch,group,n", [
    (16, 8, 16, 8, 2), (16, 8, 16, 8, 4), (16, 8, 16, 8, 8),  # the paper's config on 2, 4 and 8 GPUs
    (8, 4, 0, 8, 2), (8, 4, 8, 8, 2), (8, 4, 24, 8, 2), (12, 6, 16, 8, 2), (16, 8, 8, 4, 4),
])
def test_the_note_appears_exactly_where_the_chunks_differ_from_one_process(steps_prompts, mini, batch, group, n):
    same = _chunks(steps_prompts, mini, batch, group, n) == _chunks(steps_prompts, mini, batch, group, 1)
    note = chunk_note(batch, group, mini, n)
    assert (note is None) == same, (note, same)
    if note is not None:
        assert "rollout.batch_size" in note and f"divides {mini // n * group}" in note


def test_one_process_is_the_reference():
    assert chunk_note(0, 8, 8, 1) is None and chunk_note(64, 8, 4, 1) is None


@pytest.mark.parametrize("n,warned", [(2, True), (1, False)])
def test_building_a_run_logs_the_note_on_the_main_process(n, warned, caplog, monkeypatch):
    """``build._build_parts`` logs ``chunk_note`` as a warning, once (the main process), before anything loads."""
    from tandem_rlvr.config import load_config
    from tandem_rlvr.training import build

    class Stop(Exception):
        pass

    def stop(_seed):
        raise Stop

    monkeypatch.setattr(build, "seed_everything", stop)  # the call right after the note: nothing else runs
    cfg = load_config(None, ["model.senior=s", "model.junior=j", "algo.group_size=8", "algo.mini_batch_prompts=8",
                             "rollout.batch_size=24"])
    notes = []
    for rank in range(n):
        acc = SimpleNamespace(num_processes=n, process_index=rank, is_main_process=rank == 0)
        caplog.clear()
        with caplog.at_level("WARNING", logger=build.__name__), pytest.raises(Stop):
            build._build_parts(cfg, acc, None, None, None, None, None, None, None, None)
        notes.append([r.getMessage() for r in caplog.records if "rollout.batch_size=24" in r.getMessage()])
    assert chunk_note(24, 8, 8, 2) and notes == ([[chunk_note(24, 8, 8, n)], []] if warned else [[]])
