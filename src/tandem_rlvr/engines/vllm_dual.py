"""The dual vLLM engine: one vLLM engine holds the senior and the junior and decodes each rollout as one request.

The model and the logits processor that make this work on stock vLLM are in
:mod:`tandem_rlvr.engines.vllm_dual_model`: every token runs through both stacks, logits are
``[senior | junior | stop]`` (2V + 1 wide), and the processor, driven by the same
:class:`~tandem_rlvr.engines.handoff.SequenceSchedule` and seeded coins as every engine, masks the half of
whoever does not write next. A sampled id >= V is a junior token: ownership travels in the token stream.

This module starts such an engine (:func:`make_dual_llm`), turns its outputs into a
:class:`~tandem_rlvr.engines.types.Rollout` while replaying the schedule over them (a token whose
half is not its schedule's author stops the run: the mask was not applied), pushes the trained senior
into the senior stack only, and runs rollouts that the junior never writes on the senior stack alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module

import torch

from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.handoff import Schedule, SequenceSchedule
from tandem_rlvr.engines.types import Rollout, Sampling, rollout_from_rows
from tandem_rlvr.engines.serving import VLLM
from tandem_rlvr.engines.vllm_thread import EngineFault, EngineThread, shutdown_llm
from tandem_rlvr.errors import EngineError
from tandem_rlvr.seeds import ROW_WEIGHTS, derive_seed

__all__ = ["DualVLLMEngine", "EngineFault", "EngineThread", "shared_ids", "make_dual_llm", "check_vllm_internals", "TESTED_VLLM",
           "INTERNALS"]

TESTED_VLLM = ("0.32.0",)  # the vLLM versions the dual engine is tested with (pyproject's vllm extra)
# The vLLM names the dual engine relies on, module -> attributes; checked before an engine starts.
INTERNALS = {
    "vllm": ("LLM", "SamplingParams", "ModelRegistry"),
    "vllm.v1.sample.logits_processor": ("LogitsProcessor", "BatchUpdate", "MoveDirectionality"),
    "vllm.model_executor.models.utils": ("init_vllm_registered_model", "maybe_prefix"),
    "vllm.compilation.backends": ("set_model_tag",),
    "vllm.model_executor.model_loader.reload": ("initialize_layerwise_reload", "finalize_layerwise_reload"),
    "vllm.config": ("set_current_vllm_config",),
}


def check_vllm_internals() -> None:
    """Raise :class:`EngineError` naming the installed vLLM when a name the dual engine uses is missing."""
    try:
        version = import_module("vllm").__version__
    except Exception as e:  # noqa: BLE001 - not installed, or a broken native extension
        raise EngineError(f"the dual vLLM engine needs vllm ({e}); tested with vllm {', '.join(TESTED_VLLM)}") from None
    missing = []
    for mod, names in INTERNALS.items():
        try:
            m = import_module(mod)
        except Exception:  # noqa: BLE001
            missing.append(mod)
            continue
        missing += [f"{mod}.{n}" for n in names if not hasattr(m, n)]
    if missing:
        raise EngineError(f"the dual vLLM engine uses vLLM internals that vllm {version} lacks ({', '.join(missing)}); "
                          f"it is tested with vllm {', '.join(TESTED_VLLM)}")


def make_dual_llm(senior_path: str, junior_path: str, *, make=None, **kwargs):
    """A ``vllm.LLM`` over the tandem model of ``senior_path`` and ``junior_path`` (same vocabulary).

    :func:`vllm_backend.make_llm` pins the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``, for both vLLM
    engines): the tandem processor implements its logits-processor interface, and the V2 runner would
    refuse it. ``make``: :func:`vllm_backend.make_llm` (tests pass a wrapper); ``kwargs`` go to it."""
    from transformers import AutoConfig

    from tandem_rlvr.engines.vllm_backend import make_llm
    from tandem_rlvr.models import local_snapshot

    check_vllm_internals()
    dual = import_module("tandem_rlvr.engines.vllm_dual_model")
    dual.register()
    trust = kwargs.get("trust_remote_code", False) is True  # only when the user asked (model.trust_remote_code)
    junior_path = local_snapshot(junior_path, role="junior", code=trust)  # the dual model reads the junior's files itself
    cfg = AutoConfig.from_pretrained(str(senior_path), trust_remote_code=trust)
    vocab = int(cfg.get_text_config().vocab_size)
    overrides = {"architectures": [dual.ARCH], "vocab_size": 2 * vocab + 1, "tandem_vocab": vocab,
                 "tandem_junior": str(junior_path), "tandem_senior_architectures": list(cfg.architectures)}
    llm = (make or make_llm)(str(senior_path), hf_overrides=overrides, logits_processors=[dual.TandemLogitsProcessor],
                             **kwargs)
    llm.tandem_vocab = vocab
    return llm


def _model(llm):
    """The tandem model inside an engine whose core runs in this process."""
    from tandem_rlvr.engines.vllm_backend import local_worker

    worker = local_worker(llm)
    if worker is None:
        raise EngineError("the dual vLLM engine needs its engine core in this process (create it with make_llm())")
    return worker, worker.model_runner.get_model()


def shared_ids(input_ids: torch.Tensor, V: int) -> torch.Tensor:
    """The ids both stacks read, all in ``[0, V)``: a junior id ``V + i`` is the token ``i``; the stop sentinel
    ``2V`` (fed back as an input where a step runs after it was sampled) and any other id land in range too,
    so a vocabulary without padding rows (Qwen3's 151,936 rows, a multiple of 64) never indexes past its end."""
    return torch.remainder(input_ids, V)


class DualVLLMEngine(EngineBase):
    """Every schedule as one request per rollout on one engine that holds both models."""

    serving = VLLM
    own_weights = batches_requests = True

    def __init__(self, llm, *, eos_token_ids: Sequence[int], pad_token_id: int, sampling_params_cls=None,
                 timeout_s: float = 600.0, sleep: str = "off", junior_eos_token_ids: Sequence[int] | None = None):
        from tandem_rlvr.engines.vllm_backend import EngineSleep

        self.llm, self.V, self.sleeper = llm, int(llm.tandem_vocab), EngineSleep(llm, sleep)
        self.timeout_s, self.thread = float(timeout_s), EngineThread(name="vllm-dual-engine")  # the caller's device
        self.params_cls = sampling_params_cls or import_module("vllm").SamplingParams
        self.eos = sorted({int(e) for e in eos_token_ids})  # a senior token that ends the row
        self.eos_j = self.eos if junior_eos_token_ids is None else sorted({int(e) for e in junior_eos_token_ids})
        self.pad = int(pad_token_id)
        self._solo: bool | None = None

    def set_solo(self, solo: bool) -> None:
        """Run the senior stack alone (``solo``) or both. Prompt blocks cached while solo hold no junior KV:
        the prefix cache is dropped when tandem decoding resumes."""
        if self._solo == solo:
            return

        def switch():  # on the engine thread: the buffer is written on the engine's device and stream order
            if self._solo:
                self.llm.reset_prefix_cache()
            _model(self.llm)[1].set_solo(solo)

        self.thread.call(switch, self.timeout_s, "switching solo mode")
        self._solo = solo

    def _params(self, schedule: Schedule, sampling: Sampling, seed: int, n: int, b: int, max_rounds: int | None):
        stop = self.eos + [e + self.V for e in self.eos_j] + [2 * self.V]  # a junior id i is sampled as V + i
        args = {**schedule.to_dict(), "n": n, "b": b, "seed": seed, "max_rounds": max_rounds}  # Schedule.from_dict
        return self.params_cls(n=1, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                               top_p=sampling.top_p, top_k=sampling.top_k, seed=derive_seed(seed, b, weights=ROW_WEIGHTS),
                               stop_token_ids=stop, detokenize=False, extra_args={"tandem": args})

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        """One request per rollout; the schedule decides the author of every token inside vLLM."""
        return self.generate_many([(prompts, seed)], schedule, sampling, max_rounds=max_rounds)[0]

    def generate_many(self, batches: Sequence[tuple[PromptBatch, int]], schedule: Schedule, sampling: Sampling, *,
                      max_rounds: int | None = None) -> list[Rollout]:
        """Several ``(prompts, seed)`` chunks in one engine call (vLLM batches them all); each chunk's rollout is
        the one :meth:`generate` gives it alone (its seeds and coins depend on the chunk only)."""
        from tandem_rlvr.engines.vllm_backend import check_vllm_schedule

        check_vllm_schedule(schedule)
        self.thread.call(self.sleeper.wake, self.timeout_s, "waking the engine")
        self.set_solo(not schedule.uses_junior)
        reqs, params, spans = [], [], []
        for prompts, seed in batches:
            rows = prompts.rows()
            spans.append((len(reqs), len(reqs) + len(rows)))
            params += [self._params(schedule, sampling, seed, len(rows), b, max_rounds) for b in range(len(rows))]
            reqs += [{"prompt_token_ids": r} for r in rows]
        outs = self.thread.call(lambda: self.llm.generate(reqs, params, use_tqdm=False), self.timeout_s, "a rollout")
        toks = [list(o.outputs[0].token_ids) for o in outs]
        return [self._rollout(toks[a:b], prompts, schedule, seed, max_rounds)
                for (a, b), (prompts, seed) in zip(spans, batches)]

    def _rollout(self, outputs: list[list[int]], prompts: PromptBatch, schedule: Schedule, seed: int,
                 max_rounds: int | None) -> Rollout:
        coins = schedule.coins(len(outputs), seed)
        ids, owner, turn, rounds, finished = zip(*(self._replay(SequenceSchedule(schedule, coins, b), toks, max_rounds)
                                                   for b, toks in enumerate(outputs)))
        return rollout_from_rows(prompts.ids_BP, prompts.mask_BP, list(ids), list(owner), pad_token_id=self.pad,
                                 rounds=list(rounds), finished=list(finished), max_rounds=max_rounds,
                                 schedule=schedule.name, turn=list(turn))

    def _replay(self, sched: SequenceSchedule, toks: list[int], max_rounds: int | None):
        """One request's tokens as ``(ids, owners, decisions, rounds, ended by EOS)``, each token checked against
        the schedule's author."""
        ids, owner, turn, eos = [], [], [], False
        for tok in toks:
            if tok == 2 * self.V and sched.over(max_rounds):
                break  # the stop sentinel: the next turn would pass max_rounds
            if not 0 <= tok < 2 * self.V:  # a sentinel the processor did not ask for, or no token at all
                raise EngineError(f"the dual vLLM engine returned id {tok} at token {len(ids)}, outside [0, 2V = "
                                  f"{2 * self.V}) where the schedule's author is the "
                                  f"{'senior' if sched.author else 'junior'}: the tandem logits processor was not "
                                  "applied; is the V1 model runner in use?")
            senior = tok < self.V
            if sched.over(max_rounds) or senior != sched.author:
                raise EngineError(f"the dual vLLM engine sampled {'a senior' if senior else 'a junior'} token where the "
                                  f"schedule's author is the {'senior' if sched.author else 'junior'} (token {len(ids)}): "
                                  "the tandem logits processor was not applied; is the V1 model runner in use?")
            real = tok if senior else tok - self.V
            ids.append(real)
            owner.append(int(senior))
            turn.append(sched.decision())
            rounds = sched.rounds  # the turn of the last token written (as the in-process engine counts)
            sched.feed(real)
            if real in (self.eos if senior else self.eos_j):
                eos = True
                break
        return ids, owner, turn, rounds if ids else sched.rounds, eos

    def sync_senior(self, model) -> None:
        """Load the trained senior's weights into the senior stack, then drop the prefix cache; the junior stack
        is never touched. A sleeping engine gets its weights back first and the rest after the push."""

        def push():
            self.sleeper.wake_weights()
            self._load_senior(model)
            self.sleeper.wake()
            self.llm.reset_prefix_cache()  # awake: the scheduler's cache is reset as in any other step

        self.thread.call(push, self.timeout_s, "the weight push")

    def _load_senior(self, model) -> None:
        """vLLM's layerwise in-place reload of the senior stack from :func:`engine_weights` (a sharded senior
        streamed one unit at a time, cast to the engine's dtype), then the post-load processing of a tied
        lm_head (:func:`~tandem_rlvr.engines.vllm_backend.reprocess_tied_layers`)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        from tandem_rlvr.engines.vllm_backend import reprocess_tied_layers
        from tandem_rlvr.engines.weights import engine_weights

        worker, tandem = _model(self.llm)
        with engine_weights(model, worker.vllm_config.model_config.dtype) as weights, \
                set_current_vllm_config(worker.vllm_config):
            initialize_layerwise_reload(tandem.senior)
            tandem.senior.load_weights(weights)
            finalize_layerwise_reload(tandem.senior, worker.vllm_config.model_config)
            reprocess_tied_layers(tandem.senior)  # a tied lm_head: the reload processed embed_tokens only

    def sleep(self) -> None:
        """Release what ``rollout.vllm_sleep`` names until the next push or rollout (GPUs; a no-op on a CPU)."""
        self.thread.call(self.sleeper.sleep, self.timeout_s, "putting the engine to sleep")

    def close(self) -> None:
        """Shut the vLLM engine down on the engine thread (:meth:`EngineThread.close`: idempotent, an engine hung
        past its time limit is abandoned, never waited for)."""
        self.thread.close(lambda: shutdown_llm(self.llm), self.timeout_s)
