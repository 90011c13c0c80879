"""What a rollout engine is made of, as plain values: one frozen :class:`EngineSpec`.

The training run builds one from its config (:func:`tandem_rlvr.training.engine_spec.spec_from_config`), the
evaluation from its options (``tandem_rlvr.evaluation.eval_cli``); :func:`tandem_rlvr.engines.factory.build_engine`
turns it and the loaded models into an engine. Nothing here (nor anywhere under ``engines/``) knows either
configuration's structure. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem_rlvr.engines.schedules import schedule_names
from tandem_rlvr.engines.serving import ENGINES, MODES, VLLM_SOLO, Serves, serving
from tandem_rlvr.errors import EngineError
from tandem_rlvr.names import VLLM_SLEEP


@dataclass(frozen=True)
class EngineSpec:
    """One rollout engine.

    - ``kind``: ``hf`` (in-process) or ``vllm``; ``bridge``: the junior has another tokenizer, so the text
      bridge plays it whatever ``kind`` says; ``schedules``: the handoff schedules it must serve (checked
      before anything starts); the vLLM engine is the dual one unless ``none`` is all it must serve.
    - in-process: ``mode`` (``lockstep`` / ``catchup``); ``record_junior``: the junior's log-probs of tandem
      rollouts recorded (training's drift metrics).
    - vLLM: ``senior_path`` / ``junior_path`` (resolved local directories or hub ids; a hub id is read from its
      snapshot at ``senior_revision`` / ``junior_revision``, :func:`tandem_rlvr.models.local_snapshot`), weights ``dtype``,
      ``memory`` (its share of the device), ``max_model_len`` (the positions the run needs), ``seed``,
      ``timeout_s`` (per engine call), ``sleep`` (sleep mode between rollouts), ``trust_remote_code``,
      ``long_context`` (the user states the models read past their config: vLLM is told to allow it) and
      ``processes`` (training processes, each with its own engine: vLLM's ``external_launcher``).
    """

    kind: str = "hf"
    schedules: tuple[str, ...] = ("none",)
    bridge: bool = False
    mode: str = "lockstep"
    record_junior: bool = False
    senior_path: str = ""
    junior_path: str = ""
    senior_revision: str = ""
    junior_revision: str = ""
    dtype: str = "bfloat16"
    memory: float = 0.3
    max_model_len: int = 4096
    seed: int = 0
    timeout_s: float = 600.0
    sleep: str = "off"
    trust_remote_code: bool = False
    long_context: bool = False
    processes: int = 1

    def __post_init__(self):
        object.__setattr__(self, "schedules", tuple(self.schedules))
        checks = [(self.kind in ENGINES, "kind", f"one of {', '.join(ENGINES)}"),
                  (self.mode in MODES, "mode", f"one of {', '.join(MODES)}"),
                  (bool(self.schedules) and set(self.schedules) <= set(schedule_names()), "schedules",
                   f"one or more of {', '.join(schedule_names())}"),
                  (self.sleep in VLLM_SLEEP, "sleep", f"one of {', '.join(VLLM_SLEEP)}"),
                  (0 < self.memory <= 1, "memory", "in (0, 1]"), (self.timeout_s > 0, "timeout_s", "positive"),
                  (self.max_model_len >= 1, "max_model_len", "positive"), (self.processes >= 1, "processes", ">= 1")]
        for ok, name, want in checks:
            if not ok:
                raise EngineError(f"engine spec: {name}={getattr(self, name)!r} must be {want}")
        if self.vllm and not (self.senior_path and (self.junior_path or self.solo)):
            raise EngineError("engine spec: a vLLM engine needs senior_path"
                              + ("" if self.solo else " and junior_path (the dual engine holds both)"))

    @property
    def vllm(self) -> bool:
        """Whether vLLM makes the tokens (the text bridge never runs on vLLM)."""
        return self.kind == "vllm" and not self.bridge

    @property
    def solo(self) -> bool:
        """Whether the junior never writes (``none`` is all it serves): vLLM then holds the senior alone."""
        return set(self.schedules) == {"none"}

    def serving(self) -> Serves:
        """What the engine this spec builds serves."""
        if self.vllm and self.solo:
            return VLLM_SOLO
        return serving(self.kind, bridge=self.bridge)

    def check(self) -> None:
        """Raise the engine's error naming it and the first schedule it must serve but does not."""
        for name in self.schedules:
            self.serving().check(name)
