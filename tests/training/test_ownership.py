"""The fail-closed ownership check: a small batch's chance trains, a lost or wrong mask stops the run."""

import json
import math

import numpy as np
import pytest
import torch

from tandem_rlvr.errors import TandemError
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.training.ownership import FALSE_ALARM, check_ownership, coin_tolerance, row_disagreements
from tandem_rlvr.engines.types import Rollout
from tandem_rlvr.engines.handoff import Schedule
from helpers.trainers import base_models as models  # noqa: F401 (fixture: the two tiny models)
from helpers.trainers import word_trainer as _trainer


def test_a_small_word_run_trains_through_its_sampling_noise(tmp_path, tokenizer, models):
    """The issue's reproduction: 3 steps of 4 prompts x 4 rollouts x 32 tokens, word handoffs, p = 0.5, where the
    senior writes long words (a bias toward a token that continues a word) and the junior short ones (toward
    a word start): the token share leaves p +- 0.2 by construction, not by a lucky seed."""
    import copy

    from helpers.tiny_models import bias_token

    vocab = tokenizer.get_vocab()
    inner = next(i for t, i in sorted(vocab.items()) if t.isalpha() and len(t) > 2)  # continues a word
    start = next(i for t, i in sorted(vocab.items()) if t.startswith("\u0120") and t[1:].isalpha())  # starts one
    senior, junior = (copy.deepcopy(m) for m in models)
    tr = _trainer(tmp_path, tokenizer, (bias_token(senior, inner, 6.0), bias_token(junior, start, 6.0)))
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    shares = [r["rollout/senior_token_frac"] for r in rows]
    # the token share leaves p +- 0.2 (the old default band, which stopped the run here) ...
    assert all(s > 0.75 for s in shares), shares
    for r in rows:  # ... while the coins, whose expectation is p whatever the word lengths, stay in their band
        n, share = r["rollout/coins"], r["rollout/senior_coin_frac"]
        assert n >= 16 and abs(share - 0.5) <= coin_tolerance(int(n), 16 * 32)


def _corrupt(tr, fn):
    real = tr.rollout

    def rollout(step):
        r, idx = real(step)
        fn(r)
        return r, idx

    tr.rollout = rollout


CORRUPTIONS = {
    "all senior": lambda r: setattr(r, "owner_BT", torch.ones_like(r.owner_BT)),
    "all junior": lambda r: setattr(r, "owner_BT", torch.zeros_like(r.owner_BT)),
    "inverted": lambda r: setattr(r, "owner_BT", 1 - r.owner_BT),
    "shifted one token": lambda r: setattr(r, "owner_BT", torch.roll(r.owner_BT, 1, dims=1)),
    "rows of another rollout": lambda r: setattr(r, "owner_BT", torch.roll(r.owner_BT, 1, dims=0)),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_wrong_mask_stops_the_first_step(tmp_path, tokenizer, models, how):
    tr = _trainer(tmp_path, tokenizer, models)
    _corrupt(tr, lambda r: CORRUPTIONS[how](r) or setattr(r, "owner_BT", r.owner_BT * r.response_mask_BT))
    with pytest.raises(TandemError, match="disagrees with the handoff schedule's record"):
        tr.train_step(0)


def test_a_lost_mask_or_another_schedule_stops_the_run(tmp_path, tokenizer, models):
    tr = _trainer(tmp_path, tokenizer, models)
    _corrupt(tr, lambda r: setattr(r, "owner_BT", None))
    with pytest.raises(TandemError, match="needs ownership"):
        tr.train_step(0)
    tr = _trainer(tmp_path, tokenizer, models)
    _corrupt(tr, lambda r: setattr(r, "schedule", "none"))
    with pytest.raises(TandemError, match="schedule 'none'"):
        tr.train_step(0)
    tr = _trainer(tmp_path, tokenizer, models)  # an engine that records none of the schedule's decisions
    _corrupt(tr, lambda r: [setattr(r, k, None) for k in ("turn_author_BT", "decisions_B", "senior_decisions_B")])
    with pytest.raises(TandemError, match="recorded none of the handoff schedule's decisions"):
        tr.train_step(0)


@pytest.mark.parametrize("actual_p", [1.0, 0.0])
def test_coins_that_ignore_p_stop_the_run(tmp_path, tokenizer, models, actual_p):
    """An engine whose coins all come up one way (mask and record agree) while the run's schedule says
    p = 0.5 fails the coin test at once: the check reads p from the run's schedule, not the engine's."""
    tr = _trainer(tmp_path, tokenizer, models)
    assert tr.schedule.p == 0.5
    wrong, generate_many = make_schedule("word", tokenizer, p=actual_p), tr.engine.generate_many
    tr.engine.generate_many = lambda batches, schedule, sampling: generate_many(batches, wrong, sampling)
    with pytest.raises(TandemError, match="handoff coins chose the senior"):
        tr.train_step(0)


def test_the_explicit_band_still_applies(tmp_path, tokenizer, models):
    tr = _trainer(tmp_path, tokenizer, models, "algo.senior_frac_band=[0.9,1.0]")
    with pytest.raises(TandemError, match="outside algo.senior_frac_band"):
        tr.train_step(0)


def test_coin_tolerance_false_alarms_and_power():
    """Seeded binomial draws: no false alarm in 10^5 correct steps per size; a biased coin is caught."""
    rng = np.random.default_rng(0)
    n_max = 64 * 3000
    for n in (16, 64, 256, 1024, 8192):
        for p in (0.1, 0.5, 0.9):
            k = rng.binomial(n, p, size=100_000)
            assert int((np.abs(k / n - p) > coin_tolerance(n, n_max)).sum()) == 0
    k = rng.binomial(8192, 0.6, size=1000)  # a coin at 0.6 instead of 0.5 is caught at this size
    assert bool((np.abs(k / 8192 - 0.5) > coin_tolerance(8192, n_max)).all())
    # the small run (16 rows x 32 tokens): 42 coins all one way are caught by the coins alone
    assert coin_tolerance(42, 16 * 32, FALSE_ALARM) < 0.5 < coin_tolerance(41, 16 * 32, FALSE_ALARM)


def _bridge_like(owner, coins, senior, mask=None):
    B, T = len(owner), len(owner[0])
    z = torch.zeros(B, T, dtype=torch.long)
    mask = torch.ones(B, T, dtype=torch.long) if mask is None else torch.tensor(mask)
    return Rollout(z[:, :1], torch.ones(B, 1, dtype=torch.long), z, mask,
                   torch.tensor(owner), z.float(), None, torch.ones(B, dtype=torch.long),
                   torch.ones(B, dtype=torch.bool), schedule="step",
                   decisions_B=torch.tensor(coins), senior_decisions_B=torch.tensor(senior))


def test_bridge_rows_are_checked_against_their_turns():
    ok = _bridge_like([[1, 1, 0], [0, 0, 0], [1, 1, 1]], [2, 1, 2], [1, 0, 2])
    assert row_disagreements(ok) == 0
    assert check_ownership(ok, Schedule("step", p=0.5), budget=3)["rollout/coins"] == 5
    all_senior = _bridge_like([[1, 1, 1]] * 3, [2, 1, 2], [1, 0, 2])
    with pytest.raises(TandemError, match="per-row check"):
        check_ownership(all_senior, Schedule("step", p=0.5), budget=3)
    all_junior = _bridge_like([[0, 0, 0]] * 3, [2, 1, 2], [1, 0, 2])
    assert row_disagreements(all_junior) == 1


def test_bridge_rows_with_padding_and_rows_without_turns():
    """Padding is not a token (a one-author row padded at the end agrees with its turns); one senior token
    in a row of junior turns disagrees; a row with tokens but no recorded turn disagrees; an empty row does not."""
    mask = [[1, 1, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 0, 0]]
    owner = [[1, 1, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    turns, senior = [1, 2, 0, 0, 2, 0], [1, 0, 0, 0, 1, 0]
    got = [row_disagreements(_bridge_like([owner[b]], [turns[b]], [senior[b]], [mask[b]])) for b in range(6)]
    assert got == [0, 1, 1, 0, 0, 1]
    assert row_disagreements(_bridge_like(owner, turns, senior, mask)) == 3


def _recorded(owner, turn, schedule, mask=None):
    """A rollout whose engine recorded ``turn`` (the schedule's decisions, -1 elsewhere) and wrote ``owner``."""
    B, T = len(owner), len(owner[0])
    z = torch.zeros(B, T, dtype=torch.long)
    mask = torch.ones(B, T, dtype=torch.long) if mask is None else torch.tensor(mask)
    turn = torch.tensor(turn)
    return Rollout(z[:, :1], torch.ones(B, 1, dtype=torch.long), z, mask, torch.tensor(owner), z.float(), None,
                   torch.ones(B, dtype=torch.long), torch.ones(B, dtype=torch.bool), schedule=schedule,
                   turn_author_BT=turn, decisions_B=(turn >= 0).long().sum(-1),
                   senior_decisions_B=(turn == 1).long().sum(-1))


def test_token_check_of_solo_and_alternating_records():
    """``none``: every decision must be the senior's; ``alternate``: senior first, then strictly alternating;
    padding holds no decision; a token disagreeing with its record counts whatever the schedule."""
    from tandem_rlvr.training.ownership import token_disagreements

    pad = [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert token_disagreements(_recorded([[1, 1, 1, 0], [1, 1, 1, 1]], [[1, -1, -1, -1], [1, -1, -1, -1]], "none", pad)) == 0
    junior_solo = _recorded([[0, 0, 0, 0], [1, 1, 1, 1]], [[0, -1, -1, -1], [1, -1, -1, -1]], "none", pad)
    assert token_disagreements(junior_solo) == 1  # the record agrees with the mask, but none means the senior
    wrong_token = _recorded([[1, 0, 1, 0], [1, 1, 1, 1]], [[1, -1, -1, -1], [1, -1, -1, -1]], "none", pad)
    assert token_disagreements(wrong_token) == 1
    alt = [[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 0, 0]]
    turn = [[1, -1, 0, -1, 1, -1], [1, 0, -1, 1, 0, -1]]
    assert token_disagreements(_recorded(alt, turn, "alternate")) == 0
    assert token_disagreements(_recorded([[1, 1, 1, 1, 1, 1], alt[1]], [[1, -1, 1, -1, 1, -1], turn[1]], "alternate")) == 1
    assert token_disagreements(_recorded([[0, 0, 1, 1, 0, 0], alt[1]], [[0, -1, 1, -1, 0, -1], turn[1]], "alternate")) == 3
    assert token_disagreements(_recorded([[1, 1, 0, 0, 0, 1], alt[1]], [[1, -1, 0, -1, 1, -1], turn[1]], "alternate")) == 1


def test_coin_check_boundaries(tmp_path):
    """p = 0 or 1: one coin the other way stops the step, however many coins; a single coin is checked too;
    the bound N is rows x budget (a share just inside it passes, one beyond it stops)."""
    bern = lambda own: _recorded(own, own, "bernoulli")  # noqa: E731 - a decision before every token
    with pytest.raises(TandemError, match="1 of 1 handoff coins chose the senior"):
        check_ownership(bern([[1]]), Schedule("bernoulli", p=0.0), budget=1)
    with pytest.raises(TandemError, match="39 of 40 handoff coins"):
        check_ownership(bern([[1] * 20, [1] * 19 + [0]]), Schedule("bernoulli", p=1.0), budget=20)
    with pytest.raises(TandemError, match="1 of 40 handoff coins"):
        check_ownership(bern([[0] * 20, [0] * 19 + [1]]), Schedule("bernoulli", p=0.0), budget=20)
    assert check_ownership(bern([[1] * 20] * 2), Schedule("bernoulli", p=1.0), budget=20)["rollout/senior_coin_frac"] == 1.0
    rows = [[1] * 25, [1] * 25, [1] * 25, [1] * 6 + [0] * 19]  # 81 of 100 coins: 0.31 from p = 0.5
    assert check_ownership(bern(rows), Schedule("bernoulli", p=0.5), budget=100)["rollout/coins"] == 100  # tol(100, N=400) = 0.320
    with pytest.raises(TandemError, match="81 of 100"):
        check_ownership(bern(rows), Schedule("bernoulli", p=0.5), budget=25)  # N = 100: tol = 0.309
    with pytest.raises(TandemError, match="at 1 tokens of this step"):
        check_ownership(_recorded([[1, 0]], [[1, -1]], "word"), Schedule("word", p=0.5), budget=2)
    with pytest.raises(TandemError, match="at 1 rows \\(text bridge: per-row check\\)"):
        check_ownership(_bridge_like([[1, 1]], [1], [0]), Schedule("step", p=0.5), budget=2)


def test_coin_tolerance_by_hand():
    from tandem_rlvr.training.ownership import coin_tolerance

    assert coin_tolerance(100, 1000, 1e-6) == pytest.approx(0.3272340, rel=1e-6)  # sqrt(ln(2000 / 1e-6) / 200)
    assert coin_tolerance(1, 1, 1e-6) == pytest.approx(2.693386, rel=1e-6)  # sqrt(ln(2 / 1e-6) / 2)
    assert coin_tolerance(5, 2, 1e-6) == pytest.approx(1.269571, rel=1e-6)  # N is at least n: sqrt(ln(10 / 1e-6) / 10)
    assert math.isfinite(coin_tolerance(0, 0))


def test_the_senior_share_band_is_closed():
    from tandem_rlvr.config import load_config
    from tandem_rlvr.errors import TandemError
    from tandem_rlvr.engines.handoff import Schedule
    from tandem_rlvr.training.arms import check_senior_frac

    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused",
                                 "algo.senior_frac_band=[0.25,0.75]"])
    sched = Schedule("word", p=0.5)
    check_senior_frac(0.25, cfg.senior_band(), sched)
    check_senior_frac(0.75, cfg.senior_band(), sched)
    for frac in (0.2499, 0.7501):
        with pytest.raises(TandemError, match="outside algo.senior_frac_band"):
            check_senior_frac(frac, cfg.senior_band(), sched)


def test_parts_built_for_another_arm_are_refused(tmp_path, tokenizer, models):
    """Trainer(cfg, parts) with parts of a solo config under a trlvr config would train plain GRPO under the
    trlvr label: the schedule the parts roll out under must be the one the config's arm needs."""
    import copy

    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.build import build_run
    from tandem_rlvr.training.trainer import Trainer
    from helpers.trainers import EXAMPLES, length_reward, trainer_config

    s, j = models
    parts = build_run(trainer_config(tmp_path, "grpo"), pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer),
                      reward_fn=length_reward, examples=EXAMPLES)
    with pytest.raises(TandemError, match=r"schedule 'none', but the config's arm \(trlvr\) needs 'word'"):
        Trainer(trainer_config(tmp_path, "trlvr"), parts)
    assert Trainer(trainer_config(tmp_path, "grpo"), parts).schedule.name == "none"
