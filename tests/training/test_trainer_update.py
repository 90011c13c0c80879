"""The trainer's update of one step, checked by hand on tiny models: micro-batches give the mini-batch's update,
each chunk gets the config's loss settings and its share, dr_grpo's max_len, the drift metrics, the forwards'
micro-batch and recorded junior log-probs, gradient clipping and the non-finite gradient guard."""

import math

import pytest
import torch

from helpers.tiny_models import bias_token, make_tiny_model


@pytest.fixture(scope="module")
def trainer_parts(tokenizer):
    from tandem_rlvr.models import freeze

    eos = tokenizer.eos_token_id  # an EOS bias: responses of varied lengths
    return (bias_token(make_tiny_model(len(tokenizer), 0, 48), eos, 2.0),
            freeze(bias_token(make_tiny_model(len(tokenizer), 1, 32), eos, 2.0)))


def _reward(completion, gold):
    return float(len(completion) % 3 == 0)


def _one_step(tmp_path, tokenizer, parts, *over, spy=None, reward_fn=_reward):
    import copy
    from types import SimpleNamespace

    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.trainer import make_trainer

    examples = [SimpleNamespace(id=str(i), problem=f"What is {i} plus 1?", answer=str(i + 1)) for i in range(4)]
    cfg = load_config(None, ["algo.arm=trlvr", "model.senior=unused", "model.junior=unused", "train.steps=1",
                             "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=4",
                             "rollout.max_new_tokens=12", f"train.out_dir={tmp_path}", "algo.lr=1e-2",
                             "train.save_every=0", "train.progress=false", *over])
    tr = make_trainer(cfg, pair=Pair(copy.deepcopy(parts[0]), copy.deepcopy(parts[1]), tokenizer),
                 reward_fn=reward_fn, examples=examples)
    if spy is not None:
        spy(tr)
    return tr.train_step(0)


@pytest.mark.parametrize("loss_type", ["dapo", "token_mean", "grpo", "dr_grpo"])
def test_micro_batches_do_not_change_the_update(tmp_path, tokenizer, trainer_parts, loss_type):
    """Gradient accumulation over micro-batches of 8 rollouts equals one backward over the mini-batch of 16:
    a token-mean (dapo) chunk already divides by the mini-batch's token count, a per-sequence one is
    weighted by its share of rows."""
    whole = _one_step(tmp_path / "a", tokenizer, trainer_parts, f"algo.loss_type={loss_type}")
    split = _one_step(tmp_path / "b", tokenizer, trainer_parts, f"algo.loss_type={loss_type}",
                               "algo.micro_batch=8")
    assert abs(whole["train/loss"]) > 1e-4
    assert split["train/loss"] == pytest.approx(whole["train/loss"], rel=1e-5, abs=1e-7)
    # the gradient's norm before clipping (Adam's first step, lr * sign(g), would amplify rounding noise)
    assert split["train/grad_norm"] == pytest.approx(whole["train/grad_norm"], rel=1e-5)


def test_token_mean_metrics_do_not_depend_on_the_micro_batch(tmp_path, tokenizer, trainer_parts):
    """``train/ratio_mean`` and ``train/clip_frac`` are token means over the trained tokens: chunks of 3 rollouts
    of different lengths give the values of one chunk per mini-batch (an unweighted mean over the chunks let the
    short ones count as much as the long). The second of two mini-batches is off-policy, so its ratios are not 1."""
    over = ("algo.loss_type=dapo", "algo.mini_batch_prompts=2", "algo.clip_eps=0.02", "rollout.max_new_tokens=24")
    whole = _one_step(tmp_path / "a", tokenizer, trainer_parts, *over)
    split = _one_step(tmp_path / "b", tokenizer, trainer_parts, *over, "algo.micro_batch=3")
    assert abs(whole["train/ratio_mean"] - 1.0) > 1e-4 and whole["train/clip_frac"] > 0
    for key in ("train/ratio_mean", "train/clip_frac", "train/clip_frac_high", "train/clip_frac_low"):
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key


def test_dr_grpo_divides_by_each_mini_batch_longest_response(tmp_path, tokenizer, trainer_parts, monkeypatch):
    """dr_grpo's max_len is the longest response of the mini-batch (over processes), not T or a token sum."""
    from tandem_rlvr.training import core

    seen, rollouts = [], []
    real_loss = core.policy_loss

    def loss_spy(*a, **kw):
        seen.append(kw["max_len"])
        return real_loss(*a, **kw)

    def spy(tr):
        real_update = tr.update
        tr.update = lambda rollout, *a: rollouts.append(rollout) or real_update(rollout, *a)

    monkeypatch.setattr(core, "policy_loss", loss_spy)
    _one_step(tmp_path, tokenizer, trainer_parts, "algo.loss_type=dr_grpo", "algo.mini_batch_prompts=1",
              "rollout.max_new_tokens=24", spy=spy)
    lengths = rollouts[0].response_mask_BT.sum(-1)
    want = [int(lengths[m:m + 4].max()) for m in range(0, 16, 4)]
    assert seen == want
    assert len(set(want)) > 1  # the mini-batches differ, so T or one global maximum would not pass


@pytest.mark.parametrize("arm,beta", [("kl_reg", 0.05), ("trlvr", 0.0)])
def test_each_chunk_gets_the_configs_loss_settings_and_its_share(tmp_path, tokenizer, trainer_parts, monkeypatch,
                                                                 arm, beta):
    """A mini-batch of 16 rollouts in micro-batches of 6, 6, 4 (grpo: per-sequence means): every chunk's
    ``policy_loss`` gets the config's clip range and KL weight (the junior's log-probs only where that
    weight is > 0), its weight is ``chunk_weight(loss_type, chunk, 16, processes)``, only the last chunk
    syncs gradients, and ``train/loss`` / ``train/pg_loss`` are the chunks' values weighted by share."""
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.training import core, dist

    monkeypatch.setattr(fastpath, "SKIP_ZERO_ADVANTAGE", False)  # every row in a chunk (its own test below)
    calls, weights, syncs, seniors = [], [], [], []
    real_loss, real_weight, real_sync = core.policy_loss, core.chunk_weight, dist.no_sync_unless_last

    def loss_spy(*a, **kw):
        loss, met = real_loss(*a, **kw)
        calls.append((kw, float(loss.detach()), met["train/pg_loss"], met["train/num_tokens"]))
        return loss, met

    monkeypatch.setattr(core, "policy_loss", loss_spy)
    monkeypatch.setattr(core, "chunk_weight", lambda *a, **kw: weights.append((a, kw)) or real_weight(*a, **kw))
    monkeypatch.setattr(dist, "no_sync_unless_last", lambda acc, m, last: syncs.append((m, last)) or real_sync(acc, m, last))
    row = _one_step(tmp_path, tokenizer, trainer_parts, f"algo.arm={arm}", f"algo.kl_beta={beta}", "algo.loss_type=grpo",
                    "algo.micro_batch=6", "algo.clip_eps=0.15", "algo.clip_eps_high=0.3",
                    spy=lambda tr: seniors.append(tr.senior))
    assert len(calls) == 3
    for kw, *_ in calls:
        assert (kw["loss_type"], kw["clip_eps"], kw["clip_eps_high"], kw["kl_beta"]) == ("grpo", 0.15, 0.3, beta)
        assert (kw["ref_logps_BT"] is None) == (beta == 0)
    assert [(a, kw) for a, kw in weights] == [(("grpo", n, 16, 1), {}) for n in (6, 6, 4)]
    assert [last for _, last in syncs] == [False, False, True] and all(m is seniors[0] for m, _ in syncs)
    shares = [6 / 16, 6 / 16, 4 / 16]
    assert row["train/loss"] == pytest.approx(sum(s * c[1] for s, c in zip(shares, calls)), rel=1e-6)
    assert row["train/pg_loss"] == pytest.approx(sum(s * c[2] for s, c in zip(shares, calls)), rel=1e-6)
    assert row["train/num_tokens"] == pytest.approx(sum(c[3] for c in calls))  # the chunks' tokens add up
    assert row["train/lr"] == pytest.approx(1e-2)  # constant after no warm-up
    if beta:  # the KL term separates the two metrics
        assert abs(row["train/loss"] - row["train/pg_loss"]) > 1e-7


def _capture_trainer(tmp_path, tokenizer, trainer_parts, *over):
    got = []
    _one_step(tmp_path, tokenizer, trainer_parts, *over, spy=got.append)
    return got[0]


def test_drift_metrics_are_means_over_senior_tokens_by_hand(tmp_path, tokenizer, trainer_parts):
    """kl/senior_junior = mean of log p_s - log p_j over senior-written tokens; _k3 the k3 estimator's mean;
    one senior token in the whole step is a mean over one token; no senior token gives 0, not a division by 0."""
    from types import SimpleNamespace

    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.5, -0.25]])
    jun = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -2.5, -4.0]])
    ro = SimpleNamespace(response_mask_BT=torch.tensor([[1, 1, 0], [1, 1, 1]]),
                         owner_BT=torch.tensor([[1, 0, 1], [1, 1, 0]]))  # senior tokens: (0,0) (1,0) (1,1)
    d = [0.5, -1.0, 1.0]
    k3 = [math.exp(-x) + x - 1 for x in d]
    got = tr._drift_metrics(old, jun, ro)
    assert got["kl/senior_junior"] == pytest.approx(sum(d) / 3) and got["kl/senior_junior_k3"] == pytest.approx(sum(k3) / 3)
    one = SimpleNamespace(response_mask_BT=ro.response_mask_BT, owner_BT=torch.tensor([[0, 0, 0], [0, 1, 0]]))
    got = tr._drift_metrics(old, jun, one)
    assert got["kl/senior_junior"] == pytest.approx(1.0) and got["kl/senior_junior_k3"] == pytest.approx(k3[2])
    none = SimpleNamespace(response_mask_BT=ro.response_mask_BT, owner_BT=torch.zeros(2, 3, dtype=torch.long))
    assert tr._drift_metrics(old, jun, none) == {"kl/senior_junior": 0.0, "kl/senior_junior_k3": 0.0}
    tr.cfg.algo.kl_clamp = 0.5  # the k3 metric uses the loss's clamp: (1,0)'s e - 2 = 0.718 -> 0.5, the others below it
    got = tr._drift_metrics(old, jun, ro)
    assert got["kl/senior_junior_k3"] == pytest.approx((k3[0] + 0.5 + k3[2]) / 3)


@pytest.mark.parametrize("arm,beta", [("trlvr", 0.0), ("kl_reg", 0.05)])
def test_update_forwards_respect_the_micro_batch_and_reuse_recorded_junior_logps(tmp_path, tokenizer, trainer_parts,
                                                                                  monkeypatch, arm, beta):
    """Every teacher-forced forward of the update (old log-probs, the junior's) runs on at most
    algo.micro_batch rows; the junior runs only where the rollout did not record its log-probs (kl_reg's
    solo rollouts), never again for a tandem rollout that did."""
    from tandem_rlvr.engines import scoring

    calls, seen = [], []
    real = scoring._forward_logps
    monkeypatch.setattr(scoring, "_forward_logps", lambda m, ro, rows, t, *rest: calls.append((m, len(rows))) or real(m, ro, rows, t, *rest))
    _one_step(tmp_path, tokenizer, trainer_parts, f"algo.arm={arm}", f"algo.kl_beta={beta}", "algo.micro_batch=6",
              spy=seen.append)
    tr = seen[0]
    assert calls and max(n for _, n in calls) <= 6
    junior = [n for m, n in calls if m is tr.junior]
    assert sum(junior) == (16 if arm == "kl_reg" else 0)


def test_forward_rows_caps_the_micro_batch_by_the_logits_budget():
    """Rows per forward: the micro-batch, at most what keeps (rows, T + 1, V) logits within the budget, at least 1."""
    from tandem_rlvr.training.core import FORWARD_LOGITS, forward_rows

    assert FORWARD_LOGITS == 2 ** 28
    assert forward_rows(0, 3000, 151936) == 1 and forward_rows(8, 3000, 151936) == 1  # one 3,001 x 151,936 > budget
    assert forward_rows(0, 112, 495) == 2 ** 28 // (113 * 495) == 4799  # the CPU demo: never binds
    assert forward_rows(8, 112, 495) == 8 and forward_rows(0, 9, 10, budget=250) == 2 and forward_rows(3, 9, 10, 250) == 2
    assert forward_rows(0, 9, 10, budget=50) == 1


def test_the_no_grad_passes_and_the_update_stay_within_the_logits_budget(tmp_path, tokenizer, trainer_parts,
                                                                        monkeypatch):
    """At algo.micro_batch 0 the old and junior log-prob passes read the whole step (16 rows here) in one forward:
    at a real vocabulary and length that is hundreds of GB. A budget of 3 rows' logits cuts every forward, no-grad
    and under autograd, to 3 rows, and the step's numbers stay those of one forward (float order)."""
    from tandem_rlvr.engines import scoring
    from tandem_rlvr.training import core

    over = ("algo.arm=kl_reg", "algo.kl_beta=0.1", "algo.old_logps=recompute")
    whole = _one_step(tmp_path / "a", tokenizer, trainer_parts, *over)
    calls = []
    real = scoring._forward_logps
    monkeypatch.setattr(scoring, "_forward_logps",
                        lambda m, ro, rows, t, *rest: calls.append((len(rows), torch.is_grad_enabled())) or real(m, ro, rows, t, *rest))
    monkeypatch.setattr(core, "FORWARD_LOGITS", 3 * 13 * len(tokenizer))  # 3 rows of (12 + 1) x V logits
    cut = _one_step(tmp_path / "b", tokenizer, trainer_parts, *over)
    assert {n for n, _ in calls} <= {1, 2, 3} and any(not g for _, g in calls) and any(g for _, g in calls)
    assert sum(n for n, g in calls if not g) == 32, "the senior's old log-probs and the junior's, 16 rows each"
    for key in ("train/loss", "train/grad_norm", "kl/senior_junior"):
        assert cut[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key


def test_max_grad_norm_zero_means_no_clipping(tmp_path, tokenizer, trainer_parts):
    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts, "algo.max_grad_norm=0")
    for p in tr.senior.parameters():
        p.grad = torch.full_like(p, 1e-3)
    before = [p.detach().clone() for p in tr.senior.parameters()]
    norm = tr._clip_and_step()
    assert norm == pytest.approx(1e-3 * math.sqrt(sum(p.numel() for p in tr.senior.parameters())), rel=1e-4)
    assert all(not torch.equal(a, p) for a, p in zip(before, tr.senior.parameters()))


def test_non_finite_gradients_skip_the_update_and_count_in_a_row(tmp_path, tokenizer, trainer_parts):
    tr = _capture_trainer(tmp_path, tokenizer, trainer_parts)
    params = list(tr.senior.parameters())
    before = [p.detach().clone() for p in params]
    for k in (1, 2):
        for p in params:
            p.grad = torch.full_like(p, float("nan"))
        assert not math.isfinite(tr._clip_and_step())
        assert tr.nonfinite_run == k and all(p.grad is None for p in params)
        assert all(torch.equal(a, p) for a, p in zip(before, params))
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    assert math.isfinite(tr._clip_and_step()) and tr.nonfinite_run == 0
    assert all(not torch.equal(a, p) for a, p in zip(before, params))
    assert all(p.grad is None for p in params)  # gradients freed after the step


def _count_scoring(monkeypatch):
    from tandem_rlvr.engines import scoring

    calls = []
    real = scoring._forward_logps
    monkeypatch.setattr(scoring, "_forward_logps", lambda m, ro, rows, t, *rest: calls.append(torch.is_grad_enabled())
                        or real(m, ro, rows, t, *rest))
    return calls


@pytest.mark.parametrize("arm,beta", [("trlvr", 0.0), ("grpo", 0.0), ("kl_reg", 0.05)])
def test_old_logps_from_the_rollout_give_the_recomputed_update(tmp_path, tokenizer, trainer_parts, monkeypatch,
                                                               arm, beta):
    """algo.old_logps=rollout takes the in-process engine's recorded log-probs (no no-grad senior forward)
    and gives the update of recompute (one teacher-forced pass) up to floating-point order: the same
    loss, gradient norm, clip fraction and drift metrics, with two mini-batches so the second one's
    ratio is away from 1."""
    calls = _count_scoring(monkeypatch)
    over = (f"algo.arm={arm}", f"algo.kl_beta={beta}", "algo.mini_batch_prompts=2", "algo.lr=3e-2")
    fresh = _one_step(tmp_path / "r", tokenizer, trainer_parts, *over, "algo.old_logps=recompute")
    no_grad_recompute = calls.count(False)
    calls.clear()
    reused = _one_step(tmp_path / "o", tokenizer, trainer_parts, *over, "algo.old_logps=rollout")
    assert no_grad_recompute >= 1
    # only the junior's pass of a solo rollout (its drift metrics and kl_reg's KL), which records none
    assert calls.count(False) == (0 if arm == "trlvr" else 1)
    keys = [k for k in fresh if k.startswith(("train/", "kl/")) and k != "train/lr"]
    assert {"train/loss", "train/grad_norm"} <= set(keys)
    for k in keys:
        scale = max(abs(fresh[k]), 1e-3)
        assert reused[k] == pytest.approx(fresh[k], abs=1e-4 * scale + 1e-6), k
    assert abs(fresh["train/loss"]) > 1e-4


def test_old_logps_auto_reuses_float32_rollouts_and_recomputes_otherwise(tmp_path, tokenizer, trainer_parts,
                                                                        monkeypatch):
    """auto: the recorded log-probs for a float32 senior; one teacher-forced pass when the engine recorded
    none; rollout with an engine that recorded none is a clear error naming the key."""
    import dataclasses

    from tandem_rlvr.errors import TandemError

    calls = _count_scoring(monkeypatch)
    _one_step(tmp_path / "a", tokenizer, trainer_parts)
    assert calls.count(False) == 0

    def unrecorded(tr):
        real = tr.engine.generate_many

        def gen(*a, **kw):
            return [dataclasses.replace(r, logps_recorded=False) for r in real(*a, **kw)]
        tr.engine.generate_many = gen

    calls.clear()
    _one_step(tmp_path / "b", tokenizer, trainer_parts, spy=unrecorded)
    assert calls.count(False) >= 1
    with pytest.raises(TandemError, match="algo.old_logps=rollout"):
        _one_step(tmp_path / "c", tokenizer, trainer_parts, "algo.old_logps=rollout", spy=unrecorded)


@pytest.mark.parametrize("shared", [False, True])
def test_micro_batches_are_cut_to_their_own_longest_response(tmp_path, tokenizer, trainer_parts, monkeypatch, shared):
    """With algo.micro_batch below the mini-batch, its rows go to the chunks sorted by response length, and
    each chunk's forward reads only up to its own longest response (and prompt): the short chunks'
    forwards are narrower than the step's longest response. With the prompts shared
    (``SHARED_PROMPTS_UPDATE``) the mini-batch's distinct prompts are read once first (one logit kept) and
    each chunk's forward holds its responses only."""
    from tandem_rlvr.engines import fastpath, scoring

    monkeypatch.setattr(fastpath, "SHARED_PROMPTS_UPDATE", shared)

    widths, seen = [], []
    real_model_call = []

    def spy(tr):
        seen.append(tr)
        real = tr.senior.forward

        def fwd(*a, **kw):
            if torch.is_grad_enabled():
                widths.append((kw["input_ids"].shape[1], kw["logits_to_keep"]))
            return real(*a, **kw)
        tr.senior.forward = fwd
        real_upd = tr.update
        tr.update = lambda ro, *a: real_model_call.append(ro) or real_upd(ro, *a)

    real_fl = scoring._forward_logps
    chunk_lens = []
    monkeypatch.setattr(scoring, "_forward_logps", lambda m, ro, rows, t, *rest: (
        torch.is_grad_enabled() and chunk_lens.append(ro.response_mask_BT[rows].sum(-1).tolist())) or real_fl(m, ro, rows, t, *rest))
    _one_step(tmp_path, tokenizer, trainer_parts, "algo.micro_batch=4", "rollout.max_new_tokens=24", spy=spy)
    ro = real_model_call[0]
    lengths = ro.response_mask_BT.sum(-1)
    assert len(set(lengths.tolist())) > 2  # varied lengths, else sorting would not show
    flat = [n for c in chunk_lens for n in c]
    assert flat == sorted(flat) and sorted(flat) == sorted(lengths.tolist())
    if shared:
        (prompt_width, first_keep), *widths = widths
        assert first_keep == 1 and prompt_width == ro.prompt_ids_BP.shape[1]
        assert widths == [(max(c), max(c)) for c in chunk_lens]
    else:
        assert [keep for _, keep in widths] == [max(c) + 1 for c in chunk_lens]
    assert min(keep for _, keep in widths) < ro.response_ids_BT.shape[1] + 1


@pytest.mark.parametrize("shared", [True, False])
def test_a_chunks_log_probs_equal_the_full_width_forward(tokenizer, trainer_parts, monkeypatch, shared):
    """sequence_logps over a few rows, cut to their own longest response (and prompt, without shared
    prompts), equals the full-width forward's log-probs on every real response token (0 past the rows'
    longest response)."""
    from helpers.numeric import assert_close_to_scale
    from tandem_rlvr.engines import fastpath

    monkeypatch.setattr(fastpath, "SHARED_PROMPTS", shared)
    from tandem_rlvr.engines.scoring import sequence_logps
    from tandem_rlvr.engines.types import Rollout, token_logps

    g = torch.Generator().manual_seed(0)
    B, P, T, V = 6, 7, 10, len(tokenizer)
    p_mask = torch.ones(B, P, dtype=torch.long)
    for b, pad in enumerate([0, 2, 3, 1, 4, 2]):
        p_mask[b, :pad] = 0
    r_len = torch.tensor([3, 10, 5, 2, 7, 4])
    r_mask = (torch.arange(T)[None] < r_len[:, None]).long()
    ro = Rollout(prompt_ids_BP=torch.randint(5, V, (B, P), generator=g) * p_mask, prompt_mask_BP=p_mask,
                 response_ids_BT=torch.randint(5, V, (B, T), generator=g) * r_mask, response_mask_BT=r_mask,
                 owner_BT=r_mask, senior_logps_BT=torch.zeros(B, T), junior_logps_BT=None,
                 rounds_B=torch.ones(B, dtype=torch.long), finished_B=torch.ones(B, dtype=torch.bool))
    model = trainer_parts[0].eval()
    ids = torch.cat([ro.prompt_ids_BP, ro.response_ids_BT], 1)
    mask = torch.cat([p_mask, r_mask], 1)
    with torch.no_grad():
        full = token_logps(model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                                 logits_to_keep=T + 1).logits[:, :-1], ro.response_ids_BT, 0.7)
        for rows in (torch.tensor([0, 3, 5]), torch.tensor([2, 4]), torch.arange(B)):
            got = sequence_logps(model, ro, 0.7, rows=rows)
            assert got.shape == (len(rows), T)
            m = r_mask[rows].bool()
            assert_close_to_scale(got[m], full[rows][m])
            assert torch.all(got[:, int(r_len[rows].max()):] == 0)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_shared_prompts_in_the_update_give_the_per_chunk_gradient(tmp_path, tokenizer, trainer_parts, monkeypatch,
                                                                  loss_type):
    """fastpath.SHARED_PROMPTS_UPDATE: the mini-batch's distinct prompts read once under autograd, their share of
    the gradient taken once after the chunks, give every parameter the gradient of a forward per chunk over
    its own prompts (float order only: within 1e-5 of each tensor's largest entry), and the same loss."""
    from tandem_rlvr.engines import fastpath

    grads, keeps = {}, {}

    def spy(tr):
        real_step, real_fwd = tr._clip_and_step, tr.senior.forward

        def step():
            if shared not in grads:  # the first mini-batch: the second starts from weights one Adam step apart
                grads[shared] = {n: p.grad.clone() for n, p in tr.senior.named_parameters() if p.grad is not None}
            return real_step()

        def fwd(*a, **kw):
            if torch.is_grad_enabled():
                keeps[shared].append(kw["logits_to_keep"])
            return real_fwd(*a, **kw)
        tr._clip_and_step, tr.senior.forward = step, fwd

    rows = {}
    for shared in (False, True):
        monkeypatch.setattr(fastpath, "SHARED_PROMPTS_UPDATE", shared)
        keeps[shared] = []
        rows[shared] = _one_step(tmp_path / str(shared), tokenizer, trainer_parts, f"algo.loss_type={loss_type}",
                                 "algo.micro_batch=4", "algo.mini_batch_prompts=2", spy=spy)
    assert keeps[False].count(1) == 0 and keeps[True].count(1) == 2  # one prompt read per mini-batch
    assert len(keeps[True]) == len(keeps[False]) + 2
    assert rows[True]["train/loss"] == pytest.approx(rows[False]["train/loss"], rel=1e-5, abs=1e-7)
    a, b = grads[False], grads[True]
    assert a.keys() == b.keys() and len(a) > 5
    embed = [n for n in a if "embed" in n]
    assert embed and a[embed[0]].abs().max() > 0  # the prompts' tokens get their gradient
    for n in a:
        scale = a[n].abs().max().item()
        assert (a[n] - b[n]).abs().max().item() <= 1e-5 * scale + 1e-12, n


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_rows_without_advantage_are_left_out_of_the_update_exactly(tmp_path, tokenizer, trainer_parts, monkeypatch,
                                                                   loss_type):
    """fastpath.SKIP_ZERO_ADVANTAGE: with no KL term a row whose advantage is 0 adds exactly nothing to the
    gradient, so the update leaves it out of the forward; the chunks' shares and the token count still count
    it. Prompt 0's group is always rewarded (advantage 0 in every row): the same gradient as with every row
    forwarded (float order only), the same loss and token count, and fewer rows forwarded."""
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.training import core

    def reward(completion, gold):  # prompt "What is 0 plus 1?": always right
        return 1.0 if gold == "1" else _reward(completion, gold)

    grads, forwarded, trained, rows, real_loss = {}, {}, {}, {}, core.policy_loss

    def loss(logps, old, adv, mask, *a, **kw):  # the rows each chunk forwards, and their trained tokens
        forwarded[skip] += logps.shape[0]
        trained[skip] += float(mask.sum())
        return real_loss(logps, old, adv, mask, *a, **kw)

    def spy(tr):
        real_step = tr._clip_and_step

        def step():  # the step's one mini-batch: its gradient before the optimiser's step
            grads.setdefault(skip, {n: p.grad.clone() for n, p in tr.senior.named_parameters() if p.grad is not None})
            return real_step()
        tr._clip_and_step = step

    monkeypatch.setattr(core, "policy_loss", loss)
    for skip in (False, True):
        monkeypatch.setattr(fastpath, "SKIP_ZERO_ADVANTAGE", skip)
        forwarded[skip], trained[skip] = 0, 0.0
        rows[skip] = _one_step(tmp_path / str(skip), tokenizer, trainer_parts, f"algo.loss_type={loss_type}",
                               "algo.micro_batch=4", spy=spy, reward_fn=reward)
    assert forwarded[False] == 16 and 0 < forwarded[True] <= 12  # at least prompt 0's 4 rows left out
    assert trained[True] < trained[False]  # and they held trained tokens, which the token count must still count
    assert rows[True]["train/loss"] == pytest.approx(rows[False]["train/loss"], rel=1e-5, abs=1e-7)
    assert rows[True]["train/num_tokens"] == rows[False]["train/num_tokens"]
    a, b = grads[False], grads[True]
    assert a.keys() == b.keys() and len(a) > 5
    for n in a:
        scale = a[n].abs().max().item()
        assert scale > 0, n
        assert (a[n] - b[n]).abs().max().item() <= 1e-5 * scale + 1e-12, n


def test_rows_with_gradient_keeps_every_row_with_a_kl_term_or_when_none_would_be_left():
    from tandem_rlvr.training.core import rows_with_gradient

    adv_B = torch.tensor([0.0, 1.5, 0.0, -0.5, 0.0, 0.0])
    rows = torch.tensor([0, 1, 2, 3])
    assert rows_with_gradient(adv_B, rows).tolist() == [1, 3]
    assert rows_with_gradient(adv_B, rows, kl_beta=0.1).tolist() == [0, 1, 2, 3]  # the KL term has a gradient
    assert rows_with_gradient(adv_B, torch.tensor([4, 5, 0])).tolist() == [4, 5, 0]  # none left: all of them
    assert rows_with_gradient(adv_B, torch.tensor([5, 3])).tolist() == [3]


def test_a_mixture_of_experts_keeps_every_row():
    """An expert that only left-out rows reach would get no gradient instead of a zero one (AdamW would then
    skip its step): ``routes_experts`` turns the skip off for such models."""
    from types import SimpleNamespace

    from tandem_rlvr.engines.scoring import routes_experts

    assert routes_experts(SimpleNamespace(config=SimpleNamespace(num_experts=8)))
    assert routes_experts(SimpleNamespace(config=SimpleNamespace(num_local_experts=4, num_experts=None)))
    assert not routes_experts(SimpleNamespace(config=SimpleNamespace(num_experts=0)))
    assert not routes_experts(make_tiny_model(64, 0, 16))


def test_each_chunks_forward_runs_inside_its_gradient_sync_context(tmp_path, tokenizer, trainer_parts, monkeypatch):
    """DDP decides in the forward whether the backward all-reduces (torch's ``no_sync`` docstring), so a chunk's
    forward must run inside ``no_sync_unless_last``, not only its backward: else every micro-batch all-reduces."""
    import contextlib

    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.training import dist
    from tandem_rlvr.training import trainer as trainer_mod

    monkeypatch.setattr(fastpath, "SKIP_ZERO_ADVANTAGE", False)  # every row in a chunk: 6, 6 and 4 of 16
    inside, seen = [None], []
    real_logps = trainer_mod.sequence_logps

    @contextlib.contextmanager
    def sync(acc, model, last):
        inside[0] = last
        try:
            yield
        finally:
            inside[0] = None

    def logps(*a, **kw):
        if torch.is_grad_enabled():  # the update's own forwards, not the no-grad scoring
            seen.append(inside[0])
        return real_logps(*a, **kw)

    monkeypatch.setattr(dist, "no_sync_unless_last", sync)
    monkeypatch.setattr(trainer_mod, "sequence_logps", logps)
    _one_step(tmp_path, tokenizer, trainer_parts, "algo.micro_batch=6")
    assert seen == [False, False, True]


def test_a_sharded_senior_reduce_scatters_every_micro_batch(monkeypatch):
    """FSDP2 without gradient sync keeps each rank's whole unsharded float32 gradient until the last micro-batch;
    a sharded senior therefore syncs every one, and DDP (unsharded, several processes) skips all but the last."""
    import contextlib
    from types import SimpleNamespace

    from tandem_rlvr.training import dist, fsdp

    skipped = object()
    acc = SimpleNamespace(num_processes=2, no_sync=lambda model: skipped)
    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(fsdp, "is_sharded", lambda m: True)
    assert isinstance(dist.no_sync_unless_last(acc, model, False), contextlib.nullcontext)
    monkeypatch.setattr(fsdp, "is_sharded", lambda m: False)
    assert dist.no_sync_unless_last(acc, model, False) is skipped
    assert isinstance(dist.no_sync_unless_last(acc, model, True), contextlib.nullcontext)
    assert isinstance(dist.no_sync_unless_last(SimpleNamespace(num_processes=1), model, False), contextlib.nullcontext)
