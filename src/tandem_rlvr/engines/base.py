"""The rollout-engine interface (:class:`Engine`), its shared defaults (:class:`EngineBase`) and the prompt batch
every engine reads (:class:`PromptBatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from tandem_rlvr.engines.serving import Serves

if TYPE_CHECKING:
    from tandem_rlvr.engines.handoff import Schedule
    from tandem_rlvr.engines.types import Rollout, Sampling


@dataclass
class PromptBatch:
    """Left-padded senior-token prompts, and (for engines that re-render them, e.g. the text bridge)
    the problems they were rendered from."""

    ids_BP: torch.Tensor
    mask_BP: torch.Tensor
    problems: list[str] | None = None

    @classmethod
    def left_padded(cls, seqs: Sequence[Sequence[int]], pad_id: int, device=None,
                    problems: list[str] | None = None) -> PromptBatch:
        """Left-pad token-id lists to one width (on ``device``)."""
        width = max(1, max(len(s) for s in seqs))
        ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            if len(s):
                ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
                mask[i, width - len(s):] = 1
        return cls(ids.to(device), mask.to(device), problems)

    def rows(self) -> list[list[int]]:
        """The prompts without their padding."""
        return [row[m.bool()].tolist() for row, m in zip(self.ids_BP.cpu(), self.mask_BP.cpu())]


@runtime_checkable
class Engine(Protocol):
    """Anything that co-writes rollouts: every member the trainer, the run builder and the evaluation use.
    :class:`EngineBase` gives all but ``serving`` and ``generate``; every engine class derives from it.

    ``serving``: the schedules it serves (the config asks it); ``own_weights``: it decodes from its own copy
    of the senior (vLLM), so a sharded senior need not be gathered for its rollouts; ``batches_requests``: it
    schedules many chunks at once, so callers hand it all of them in one :meth:`generate_many` call."""

    serving: Serves
    own_weights: bool
    batches_requests: bool

    def serves(self, schedule: Schedule) -> bool: ...

    def check(self, schedule: Schedule) -> None: ...

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout: ...

    def generate_many(self, batches: Sequence[tuple[PromptBatch, int]], schedule: Schedule, sampling: Sampling, *,
                      max_rounds: int | None = None) -> list[Rollout]: ...

    def sync_senior(self, model) -> None: ...

    def sleep(self) -> None: ...

    def close(self) -> None: ...


class EngineBase:
    """``serves`` / ``check`` from the class's ``serving`` declaration, ``generate_many`` as one ``generate`` per
    chunk, no-op ``sync_senior`` / ``sleep`` / ``close``, and neither ``own_weights`` nor ``batches_requests``
    (see :class:`Engine`)."""

    serving: Serves
    own_weights = False
    batches_requests = False

    def serves(self, schedule: Schedule) -> bool:
        return self.serving.refusal(schedule.name) is None

    def check(self, schedule: Schedule) -> None:
        """Raise an error naming this engine and ``schedule`` unless it is served."""
        self.serving.check(schedule.name)

    def generate_many(self, batches, schedule: Schedule, sampling: Sampling, *, max_rounds: int | None = None) -> list:
        """``generate`` of each ``(prompts, seed)`` chunk; engines that batch requests themselves (vLLM) take them
        in one call, with the same result for each chunk."""
        return [self.generate(p, schedule, sampling, seed=seed, max_rounds=max_rounds) for p, seed in batches]

    def sync_senior(self, model) -> None:
        """Engines that hold their own copy of the senior's weights load ``model``'s here (after updates)."""

    def sleep(self) -> None:
        """Give memory back to training until the next ``sync_senior`` or ``generate`` (vLLM sleep mode)."""

    def close(self) -> None:
        """Release what the engine holds (vLLM: shut its engine down) before the run closes its process
        group; idempotent, and safe after a fault (a hung engine call is abandoned, not waited for)."""

