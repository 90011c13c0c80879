"""The demo report's verdicts on synthetic results: equivalence for claim 1, one seed never decides,
claim 5 over the β sweep, and every evaluated curve point in the table."""

import pytest

from tandem_rlvr.demo.report import EQUIV_MARGIN_PTS, claims, metrics_table

RUNS = ("grpo", "trlvr", "kl_reg@0.01", "kl_reg@0.1", "kl_reg@1")
CURVE = {"1.0": 0.6, "0.75": 0.6, "0.5": 0.55, "0.25": 0.5}


def _metrics(solo, tax, kl=1.0):
    return {"solo_pass@1": solo, "communication_tax": tax, "kl_senior_junior_exact": kl, "junior_ce": kl,
            "curve": dict(CURVE)}


def _results(per_run):
    """``per_run``: {run: [(solo, tax, kl) per seed]}."""
    arms = {r: {str(s): _metrics(*v) for s, v in enumerate(vals)} for r, vals in per_run.items()}
    return {"warm_start": _metrics(0.5, 10.0), "arms": arms, "curves": {r: {} for r in arms}}


def _base(n_seeds, trlvr_solo=(0.70, 0.71, 0.69, 0.70, 0.70)):
    grpo = [(0.70 + 0.005 * (s % 2), 25.0 + s, 3.0) for s in range(n_seeds)]
    trlvr = [(trlvr_solo[s], -2.0 + 0.5 * s, 0.2) for s in range(n_seeds)]
    kl = {f"kl_reg@{b}": [(0.70, 15.0 + s, 2.0) for s in range(n_seeds)] for b in ("0.01", "0.1", "1")}
    return {"grpo": grpo, "trlvr": trlvr, **kl}


def test_one_seed_decides_nothing():
    text = claims(_results(_base(1)))
    assert all("direction only (one seed)" in c for c in text if c[0].isdigit()), text
    assert not any("reproduced" in c for c in text), text


def test_claim1_is_an_equivalence_test_with_a_printed_margin():
    res = _results(_base(5))
    c1 = claims(res)[0]
    assert f"± {EQUIV_MARGIN_PTS:g} points" in c1 and "reproduced (the whole 95% interval" in c1
    # a noisy difference whose interval leaves the margin is inconclusive, even with a small mean
    noisy = _base(5, trlvr_solo=(0.55, 0.85, 0.60, 0.80, 0.70))
    assert "inconclusive" in claims(_results(noisy))[0]
    far = _base(5, trlvr_solo=(0.50, 0.51, 0.49, 0.50, 0.50))
    assert "not reproduced" in claims(_results(far))[0]


def test_claim5_needs_every_beta_worse_with_bonferroni_intervals():
    per = _base(5)
    text = claims(_results(per))
    head = next(c for c in text if c.startswith("5."))
    assert "reproduced: at every β" in head and "Bonferroni over the 6 one-sided comparisons" in head
    assert "99.17% intervals" in head
    assert sum(c.strip().startswith("- β =") for c in text) == 3
    # one β as good as TRLVR on both: the claim fails
    per["kl_reg@1"] = [(0.70, -2.0 + 0.5 * s, 0.2) for s in range(5)]
    text = claims(_results(per))
    assert "not reproduced: at some β" in next(c for c in text if c.startswith("5."))
    assert any("β = 1:" in c and "not shown worse" in c for c in text)


def test_claims_2_to_4_need_the_interval_to_exclude_zero():
    text = claims(_results(_base(5)))
    assert all("reproduced (95% interval excludes 0)" in text[i] for i in (1, 2, 3)), text


def test_table_shows_every_curve_point_and_every_beta():
    table = metrics_table(_results(_base(3)))
    for p in CURVE:
        assert f"p={p} |" in table, p
    for col in ("grpo", "trlvr", "kl_reg β=0.01", "kl_reg β=0.1", "kl_reg β=1"):
        assert f" {col} |" in table.splitlines()[0], col
    assert "||" not in table  # a table cell must not contain the column separator


@pytest.mark.parametrize("n", [2, 12])
def test_intervals_use_t_quantiles_for_any_seed_count(n):
    res = _results({"grpo": [(0.5 + 0.01 * s, 1.0, 1.0) for s in range(n)], "trlvr": [(0.5, 1.0, 1.0)] * n})
    row = next(line for line in metrics_table(res).splitlines() if line.startswith("| solo pass@1"))
    assert "±" in row


def _curve_results(select="pass@4", val_every=5):
    def rows(vals):
        return [{"step": 5 * (i + 1), "senior/solo_pass@4": v} for i, v in enumerate(vals)]
    curves = {"grpo": {"0": rows([0.5, 0.8, 0.6]), "1": rows([0.9, 0.9, 0.95])},
              "trlvr": {"0": rows([0.7, 0.75, 0.7]), "1": rows([0.6])}}  # one validation: no choice to describe
    return {"plan": {"select": select, "val_every": val_every, "val_problems": 32}, "curves": curves}


def test_the_checkpoint_choice_is_described_against_one_validations_standard_error():
    from tandem_rlvr.demo.report import _selection_note, choice_margins

    margins, se = choice_margins(_curve_results())
    # by hand: best 0.8 vs last 0.6, the last itself (0.95), best 0.75 vs last 0.7; the largest
    # sqrt(v (1 - v) / 32) over the chosen values 0.8, 0.95, 0.75 is at 0.75
    assert margins == pytest.approx([0.2, 0.0, 0.05])
    assert se == pytest.approx((0.75 * 0.25 / 32) ** 0.5)
    note = _selection_note(_curve_results())
    assert len(note) == 1 and "a median 5.0 points (at most 20.0)" in note[0] and "over 3 runs" in note[0]
    assert "standard error of up to 7.7 points" in note[0]
    assert _selection_note(_curve_results(select="")) == [] and _selection_note(_curve_results(val_every=0)) == []
