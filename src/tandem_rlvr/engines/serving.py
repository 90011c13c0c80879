"""Which engine serves which handoff schedule: declared once, torch-free (``config.validate`` asks it), from the
schedule registry (:mod:`tandem_rlvr.engines.schedules`): the in-process and dual vLLM engines serve every
registered schedule, the text bridge the step-level ones."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_rlvr.errors import BridgeError, EngineError
from tandem_rlvr.engines.schedules import get_schedule, schedule_names

ENGINES = ("hf", "vllm")  # rollout.engine / eval --engine
MODES = ("lockstep", "catchup")  # rollout.mode / eval --mode: how the in-process engine keeps both models in step


@dataclass(frozen=True)
class Serves:
    """An engine's name (as messages show it), the schedules it serves, and why it refuses the others."""

    engine: str
    schedules: tuple[str, ...]
    why: str = ""
    error: type[EngineError] = EngineError

    def refusal(self, schedule: str) -> str | None:
        """None if ``schedule`` is served, else a one-line reason that names the engine and the schedule."""
        if schedule in self.schedules:
            return None
        return (f"handoff schedule {schedule!r} is not served by the {self.engine} engine "
                f"(it serves {', '.join(self.schedules)}): {self.why}")

    def check(self, schedule: str) -> None:
        """Raise this engine's error type unless it serves ``schedule``."""
        why = self.refusal(schedule)
        if why is not None:
            raise self.error(why)


IN_PROCESS = Serves("in-process", schedule_names())
VLLM = Serves("vllm", schedule_names(),  # the dual engine (engines.vllm_dual)
              "vLLM serves every handoff schedule of tandem_rlvr.engines.handoff; this one is not among them")
VLLM_SOLO = Serves("vllm solo", ("none",), "a plain vLLM engine holds the senior alone (solo arms); tandem "
                   "rollouts run on the dual engine (tandem_rlvr.engines.vllm_dual)")
STEP_LEVEL = tuple(n for n in schedule_names() if get_schedule(n).level == "step")  # coins only at step ends
BRIDGE = Serves(
    "text bridge", STEP_LEVEL,
    "the senior and junior tokenizers differ, so a handoff can only fall at a step end, where both read the "
    "same text; word and token handoffs fall at token boundaries of one vocabulary that the other does not "
    "share. Use handoff.schedule=step or alternate, or a junior with the senior's tokenizer", BridgeError)


def serving(engine: str, *, bridge: bool = False) -> Serves:
    """What the engine a setting selects serves: the text bridge when the tokenizers differ, else ``engine``."""
    if bridge:
        return BRIDGE
    if engine not in ENGINES:
        raise EngineError(f"unknown rollout engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return VLLM if engine == "vllm" else IN_PROCESS
