"""Text bridge: step-level tandem rollouts for a senior and a junior whose tokenizers differ.

The lockstep engine (:mod:`tandem_rlvr.engines.rollout`) needs one shared vocabulary. When the two models
tokenize differently, the shared history is kept as *text* and the turns are played by the turn driver
(:mod:`tandem_rlvr.engines.turns`): the current author reads its own prompt and its own encoding of the
response so far and writes one reasoning step (until its text holds ``"\\n\\n"``, EOS or the budget);
the step's text joins the history with its owner; the row's schedule draws the coin of its next step end.
At the end the text is encoded with the senior's tokenizer and each senior token is the senior's iff the
senior wrote every character it covers (a token that straddles a junior/senior boundary counts as the
junior's: the senior is only trained on tokens it wrote entirely).

The result is a :class:`~tandem_rlvr.engines.types.Rollout` over the senior's tokens, so the trainer's
loss mask (``response_mask * owner``) works unchanged. ``junior_logps_BT`` is None: the junior's
log-probs live on its own tokens, which do not line up with the senior's.

Only step-level schedules can be bridged in training (``step``: a coin with P(senior)=p at every step end;
``alternate``: the senior writes the first step, then strict alternation). Word- and token-level schedules
hand off every few tokens, where a token of one vocabulary is no unit of the other; they raise
:class:`BridgeError` (the evaluation's word curve across tokenizers runs them through the same driver).

Budget: ``max_new_tokens`` counts the tokens each author emitted, in its own vocabulary.
Cost: every turn re-encodes and re-reads the whole history (no KV cache survives a handoff).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.handoff import Schedule
from tandem_rlvr.engines.scoring import sequence_logps
from tandem_rlvr.engines.serving import BRIDGE
from tandem_rlvr.engines.turns import (
    Side,
    TurnRules,
    chains_to_rollout,
    encode_texts,
    make_side,
    run_turns,
    senior_token_owner,
    start_chains,
)
from tandem_rlvr.engines.types import Rollout, Sampling
from tandem_rlvr.errors import BridgeError

__all__ = ["BridgeEngine", "BridgeError", "BridgeRollout", "bridge_generate", "check_bridge_schedule", "make_side",
           "senior_token_owner", "tokenizers_differ"]


def tokenizers_differ(senior_tok, junior_tok) -> bool:
    """True when the two tokenizers do not map every token string to the same id."""
    return senior_tok.get_vocab() != junior_tok.get_vocab()


def check_bridge_schedule(name: str) -> None:
    """Raise :class:`BridgeError` unless ``name`` is a step-level schedule the bridge can run."""
    BRIDGE.check(name)


@dataclass
class BridgeRollout:
    """A bridged batch: the senior-token :class:`Rollout`, the final texts and their owner spans.

    ``spans[b]`` lists maximal ``(start, end, owner)`` character runs covering ``texts[b]``.
    """

    rollout: Rollout
    texts: list[str]
    spans: list[list[tuple[int, int, int]]]


def bridge_generate(senior: Side, junior: Side, senior_prompts: Sequence[str], junior_prompts: Sequence[str] | None,
                    schedule: Schedule, sampling: Sampling, *, seed: int = 0, max_rounds: int | None = None,
                    score: bool = True) -> BridgeRollout:
    """Co-write responses through text; see the module docstring.

    ``senior_prompts`` / ``junior_prompts``: the prompts already rendered with each model's chat
    template (``junior_prompts`` None = the same strings). ``schedule``: ``step`` (a coin with
    P(senior) = ``schedule.p`` at each step end) or ``alternate``. ``max_rounds`` ends a chain once it
    would start turn ``max_rounds + 1``. ``score`` fills ``senior_logps_BT`` by one teacher-forced pass.
    """
    check_bridge_schedule(schedule.name)
    if not 0.0 <= schedule.p <= 1.0:
        raise BridgeError(f"handoff p must be in [0, 1], got {schedule.p}")
    junior_prompts = senior_prompts if junior_prompts is None else junior_prompts
    if len(junior_prompts) != len(senior_prompts) or not senior_prompts:
        raise BridgeError(f"need one junior prompt per senior prompt, got {len(junior_prompts)} and {len(senior_prompts)}")
    chains = start_chains(schedule, schedule.coins(len(senior_prompts), seed), sampling.max_new_tokens)
    prompt_ids = (encode_texts(senior.tokenizer, senior_prompts), encode_texts(junior.tokenizer, junior_prompts))
    gen = torch.Generator().manual_seed(int(seed))
    run_turns((senior, junior), prompt_ids, chains, sampling, gen, TurnRules(max_rounds=max_rounds))
    rollout = chains_to_rollout(senior, chains, prompt_ids[0], schedule.name, max_rounds)
    if score:
        with torch.inference_mode():
            logps_BT = sequence_logps(senior.model, rollout, sampling.temperature or 1.0)  # greedy: scored at t = 1
        rollout.senior_logps_BT = logps_BT.cpu() * rollout.response_mask_BT.cpu()
    return BridgeRollout(rollout, [c.text for c in chains], [[tuple(s) for s in c.spans] for c in chains])


class BridgeEngine(EngineBase):
    """The text bridge behind the :class:`~tandem_rlvr.engines.base.Engine` interface: it renders each
    prompt's problem with both chat templates (``prompts.problems`` is required). ``score`` fills
    ``senior_logps_BT`` (the trainer recomputes them itself)."""

    serving = BRIDGE

    def __init__(self, senior, tokenizer, junior, junior_tokenizer, *, eos_token_ids: Sequence[int] | None = None,
                 score: bool = False):
        self.senior, self.tok, self.junior, self.jtok = senior, tokenizer, junior, junior_tokenizer
        self.eos, self.score = eos_token_ids, score

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        from tandem_rlvr.data import render_prompt

        self.check(schedule)
        if prompts.problems is None:
            raise BridgeError("the text bridge renders each prompt with both chat templates: pass the problems "
                              "(PromptBatch.problems)")
        out = bridge_generate(
            make_side(self.senior, self.tok, self.eos), make_side(self.junior, self.jtok),
            [render_prompt(self.tok, q) for q in prompts.problems], [render_prompt(self.jtok, q) for q in prompts.problems],
            schedule, sampling, seed=seed, max_rounds=max_rounds, score=self.score,
        )
        return out.rollout

    def sync_senior(self, model) -> None:
        self.senior = model
