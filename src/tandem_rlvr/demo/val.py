"""The demo's validation of the senior *alone* during training, and its best checkpoint.

The training curves of the ``trlvr`` arm are measured on team chains (co-written with the junior),
which hide the senior's own style. Every few steps the demo's trainer instead samples the senior
alone on a fixed validation split (same problems and seed at every step and in every run) and logs
``senior/solo_pass@1`` (and ``senior/solo_pass@K`` for every K up to the samples per problem),
``senior/jargon_rate``, ``senior/kl_exact`` (per-token KL(senior ‖ junior) on those chains, full
vocabulary) and ``senior/junior_ce``.

The paper's protocol (METHOD.md §3): validation is the senior alone, and the evaluated checkpoint is the
one with the best held-out pass@4. :class:`DemoTrainer` keeps the senior's weights at the best value of
the plan's ``select`` metric (strictly better replaces, so ties keep the earlier step, as
:func:`tandem_rlvr.training.trainer.improves`), in memory: the worlds' models are tiny.
"""

from __future__ import annotations

import torch

from tandem_rlvr.training.trainer import Trainer, improves

VAL_SEED = 4242  # one seed for every step and run: the points differ only by the senior


def senior_alone(senior, junior, tok, examples, scorer, *, n: int, max_new_tokens: int, style_rate=None) -> dict:
    """Solo chains of ``senior`` on ``examples`` (``n`` each, evaluation decoding): accuracy, jargon
    rate, and the junior's view of them (exact KL and CE, teacher-forced)."""
    from tandem_rlvr.data import encode_prompts
    from tandem_rlvr.evaluation.evaluate import chain_scores, eval_sampling
    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.models import eos_ids
    from tandem_rlvr.engines.rollout import generate
    from tandem_rlvr.evaluation.metrics import pass_at_ks
    from tandem_rlvr.world.problems import jargon_rate

    style_rate = style_rate or jargon_rate  # the world's compressed-style detector (default: jargon)

    keep, prompts = encode_prompts(tok, examples, max_prompt_tokens=256, what="senior-alone validation")
    rows = [i for i in range(len(prompts)) for _ in range(n)]
    batch = PromptBatch.left_padded([prompts[i] for i in rows], tok.pad_token_id)
    ids_BP, mask_BP = batch.ids_BP, batch.mask_BP
    was_training = senior.training
    senior.eval()
    try:
        with torch.no_grad():
            ro = generate(senior, junior, ids_BP, mask_BP, make_schedule("none"), eval_sampling(max_new_tokens),
                          eos_token_ids=eos_ids(tok, senior), pad_token_id=tok.pad_token_id, seed=VAL_SEED,
                          record_junior=False)
            scores = chain_scores(senior, junior, ro)
    finally:
        senior.train(was_training)
    texts = ro.texts(tok)
    rewards, _ = scorer.score(texts, [str(examples[keep[i]].answer) for i in rows])
    per_problem = [[float(r) for r in rewards[j * n:(j + 1) * n]] for j in range(len(prompts))]
    return {**{f"senior/solo_pass@{k}": v for k, v in pass_at_ks(per_problem, range(1, n + 1)).items()},
            "senior/jargon_rate": style_rate(texts),
            "senior/kl_exact": float(scores["kl_exact"].mean()),
            "senior/junior_ce": float(scores["junior_ce"].mean())}


class DemoTrainer(Trainer):
    """The library's trainer whose periodic validation (``val.every``) is :func:`senior_alone`; with a
    ``select`` metric (``"pass@4"``) it keeps the senior's weights at the best value of
    ``senior/solo_<select>`` (:attr:`best_state`, the step and value in :attr:`best_val`)."""

    def __init__(self, cfg, parts, *, val_examples, scorer, val_n: int, style_rate=None, select: str | None = None):
        super().__init__(cfg, parts)
        self._val = (val_examples, scorer, val_n, style_rate)
        self.select_key = f"senior/solo_{select}" if select else None
        self.best_val: dict | None = None  # {"step", "value", "metric"} of the kept weights
        self.best_state: dict | None = None

    def validate(self) -> dict:
        examples, scorer, n, rate = self._val
        senior = self.acc.unwrap_model(self.senior)
        metrics = senior_alone(senior, self.pair.junior, self.tok, examples, scorer, n=n,
                               max_new_tokens=self.cfg.rollout.max_new_tokens, style_rate=rate)
        key = self.select_key
        if key is not None:
            if key not in metrics:
                raise ValueError(f"the demo plan selects by {key!r}, but validation with {n} samples per problem "
                                 f"computes only {sorted(k for k in metrics if 'pass@' in k)}")
            if improves(None if self.best_val is None else self.best_val["value"], metrics[key]):
                self.best_val = {"step": self.step, "value": metrics[key], "metric": key}
                self.best_state = {k: v.detach().clone() for k, v in senior.state_dict().items()}
        return metrics

    def load_best(self):
        """The senior with the kept best weights loaded (unchanged when nothing was selected)."""
        senior = self.acc.unwrap_model(self.senior)
        if self.best_state is not None:
            senior.load_state_dict(self.best_state)
        return senior
