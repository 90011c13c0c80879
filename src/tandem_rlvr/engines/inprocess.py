"""The in-process engine: :func:`tandem_rlvr.engines.rollout.generate` behind the :class:`Engine` interface."""

from __future__ import annotations

from collections.abc import Sequence

from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.serving import IN_PROCESS, MODES
from tandem_rlvr.errors import EngineError
from tandem_rlvr.engines.rollout import generate


class InProcessEngine(EngineBase):
    """The senior and junior (one vocabulary) decoded here, ``mode`` ``lockstep`` or ``catchup``.

    ``record_junior``: with a tandem schedule, run the junior on every token to record its log-probs
    (the trainer's drift metrics); solo schedules never run it. ``junior_eos_token_ids``: the ids that end a
    row where the junior writes them (default: ``eos_token_ids``, the senior's). ``hold_casts``: under mixed
    precision, autocast's casts of the weights held for a rollout (:func:`~tandem_rlvr.engines.rollout.generate`).
    """

    serving = IN_PROCESS

    def __init__(self, senior, junior, *, eos_token_ids: Sequence[int], pad_token_id: int, mode: str = "lockstep",
                 record_junior: bool = False, junior_eos_token_ids: Sequence[int] | None = None,
                 hold_casts: bool = False):
        if mode not in MODES:
            raise EngineError(f"unknown rollout mode {mode!r}; choose one of {', '.join(MODES)}")
        self.senior, self.junior, self.mode, self.record_junior = senior, junior, mode, record_junior
        self.eos, self.pad = [int(e) for e in eos_token_ids], int(pad_token_id)
        self.junior_eos = None if junior_eos_token_ids is None else [int(e) for e in junior_eos_token_ids]
        self.hold_casts = hold_casts

    def generate(self, prompts: PromptBatch, schedule, sampling, *, seed: int = 0, max_rounds: int | None = None):
        self.check(schedule)
        return generate(self.senior, self.junior, prompts.ids_BP, prompts.mask_BP, schedule, sampling,
                        eos_token_ids=self.eos, pad_token_id=self.pad, seed=seed, max_rounds=max_rounds,
                        record_junior=self.record_junior and schedule.name != "none", mode=self.mode,
                        junior_eos_token_ids=self.junior_eos, hold_casts=self.hold_casts)

    def sync_senior(self, model) -> None:
        self.senior = model
