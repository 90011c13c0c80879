"""The demo's best checkpoint (the paper's protocol): the weights evaluated are the senior's at the validation
step with the best ``select`` metric, ties keeping the earlier step, not the final step's."""

import copy

import pytest
import torch

from tandem_rlvr.demo import jobs
from tandem_rlvr.demo import val as demo_val
from tandem_rlvr.demo.plan import QUICK, DemoPlan

SCRIPT = [0.25, 0.75, 0.5, 0.75]  # pass@2 at steps 1..4: the best is step 2 (step 4 ties it, later)


@pytest.fixture()
def recorded(world, monkeypatch):
    """One quick trlvr job of 4 steps, validated after every step with scripted pass@2 values; returns the
    senior's weights at each validation and the weights the job evaluated."""
    paths, _ = world
    states, evaluated = [], {}

    def fake_alone(senior, *a, **kw):
        states.append({k: v.detach().clone() for k, v in senior.state_dict().items()})
        v = SCRIPT[len(states) - 1]
        return {"senior/solo_pass@1": v / 2, "senior/solo_pass@2": v, "senior/jargon_rate": 0.0,
                "senior/kl_exact": 0.0, "senior/junior_ce": 0.0}

    def fake_eval(senior, *a, **kw):
        evaluated.update({k: v.detach().clone() for k, v in senior.state_dict().items()})
        return {"solo_pass@1": 0.0}

    monkeypatch.setattr(demo_val, "senior_alone", fake_alone)
    monkeypatch.setattr(jobs, "_evaluate", fake_eval)
    plan = DemoPlan(**{**QUICK.__dict__, "steps": 4, "val_every": 1, "kl_betas": ()})
    ctx = jobs.JobContext(str(paths.senior_dir), str(paths.junior_dir), plan, str(paths.root.parent / "ckpt-test"))
    _, metrics = jobs._train_and_evaluate(ctx, ("trlvr", 0), progress=False)
    return states, evaluated, metrics


def test_the_evaluated_weights_are_the_best_validation_steps(recorded):
    states, evaluated, metrics = recorded
    assert len(states) == len(SCRIPT)
    best = SCRIPT.index(max(SCRIPT))  # by hand: the first of the maxima (step 2)
    assert metrics["checkpoint_step"] == best + 1 == 2
    for k, v in evaluated.items():
        torch.testing.assert_close(v, states[best][k], rtol=0, atol=0)
    moved = [k for k in evaluated if not torch.equal(states[-1][k], states[best][k])]
    assert moved, "training did not move the senior between steps 2 and 4: the test could not tell them apart"


def test_without_select_the_final_step_is_evaluated(world, monkeypatch):
    paths, _ = world
    evaluated = {}
    monkeypatch.setattr(jobs, "_evaluate", lambda senior, *a, **kw: evaluated.update(copy.deepcopy(senior.state_dict()))
                        or {"solo_pass@1": 0.0})
    plan = DemoPlan(**{**QUICK.__dict__, "steps": 2, "val_every": 0, "select": "", "kl_betas": ()})
    ctx = jobs.JobContext(str(paths.senior_dir), str(paths.junior_dir), plan, str(paths.root.parent / "ckpt-final"))
    _, metrics = jobs._train_and_evaluate(ctx, ("grpo", 0), progress=False)
    assert metrics["checkpoint_step"] == 2
    final = jobs._world(ctx)["warm"].state_dict()  # the warm start: the trained senior must differ from it
    assert any(not torch.equal(final[k], evaluated[k]) for k in evaluated)
