"""Word- and token-level tandem rollouts on stock vLLM: one request per author turn, no batch barrier.

Serves the schedules ``word``, ``bernoulli`` and ``chunk`` for :class:`~tandem_rlvr.engines.vllm_backend.VLLMEngine`.
Every schedule decision comes from each row's :class:`~tandem_rlvr.engines.handoff.SequenceSchedule`
(fed every token; ``max_turn_tokens`` and ``boundary_ids`` bound a turn) and every coin from the
schedule's seeded :class:`~tandem_rlvr.engines.handoff.CoinStream` (draw ``t + 1`` after response token
``t``); no rule is written here. So under greedy decoding the tokens, owners, rounds and finished flags
are the in-process engine's, token for token.

How a sequence is driven:

- A **turn** is one request to the current author's engine whose prompt is the whole shared history.
  The other model reads what it missed as the prefill of its own next request (catch-up); with
  prefix caching only the blocks it has not computed yet are prefilled. No model decodes the other's
  tokens.
- Where a coin is due is known in advance for ``bernoulli`` and ``chunk`` (it does not depend on the
  tokens): the pre-drawn coins give the exact turn length, sent as ``max_tokens``. For ``word`` two
  ways (``turn_stop``):

  - ``"abort"`` (default): the request runs with no word stop; the driver reads each engine step's
    new tokens, applies the schedule per token and aborts the request at the first word start whose
    coin changes the author. A coin that keeps the author costs nothing (no new request).
  - ``"stop"``: ``stop_token_ids`` = every word-start id (vLLM keeps the stop token in the output)
    and ``max_tokens`` = the ``max_gap`` cap; a coin that keeps the author costs a new request to the
    same engine (a round trip, a prefix-cache lookup and the prefill of the partial last block).

- **No batch barrier**: sequences are driven independently through each engine's step loop
  (``LLMEngine.add_request`` / ``step`` / ``abort_request``). A finished turn's next request joins
  the running batch at the next step; each driver round steps both engines, at most
  ``max_in_flight`` requests are in flight.
- **Both engines busy at once** needs engine cores in their own processes
  (``make_llm(processes=True)``, :mod:`tandem_rlvr.engines.vllm_procs`): each core decodes in its
  own busy loop, ``step()`` collects what it has produced (every queued output, not just one), and
  the driver waits on both engines' steps at the same time, one thread each. In-process engines are
  stepped one after the other on one thread (vLLM's forward context is process-global).
- **Faults**: an engine step that raises, or that does not answer within ``timeout_s``, or (multiprocess
  engines) whose core process has exited, stops the rollout with :class:`EngineFault` (a
  :class:`~tandem_rlvr.errors.TandemError`: the run stops, the last checkpoint is untouched). A history that reaches the engine's context (``max_model_len``)
  ends that sequence there, counted in ``stats["context_cut"]``.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import CoinStream, Schedule, SequenceSchedule
from tandem_rlvr.engines.rollout import Rollout, Sampling, rollout_from_rows
from tandem_rlvr.engines.vllm_procs import dead_process, is_multiprocess, step_ready
from tandem_rlvr.errors import TandemError

TURN_LEVEL = ("word", "bernoulli", "chunk")  # the schedules this driver serves (VLLMEngine routes them here)

TURN_STOPS = ("abort", "stop")
DEFAULT_TIMEOUT_S = 600.0
POLL_S = 1.0  # while waiting on an engine, look this often whether its core process died
NAMES = {True: "senior", False: "junior"}


class EngineFault(TandemError):
    """A vLLM engine raised or stopped answering mid-rollout; the message names the engine."""


@dataclass
class Row:
    """One sequence: its prompt, the shared history, owners and its schedule (who writes next)."""

    prompt: list[int]
    sched: SequenceSchedule
    ids: list[int] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)  # the schedule's decisions (Rollout.turn_author_BT)
    done: bool = False
    eos: bool = False
    requests: int = 0

    @property
    def rounds(self) -> int:
        return self.sched.rounds


@dataclass
class _Live:
    """A request in flight: its row, its engine and how many of its tokens were read."""

    b: int
    author: bool
    seen: int = 0


def _new_stats() -> dict:
    return {"requests": 0, "same_author_requests": 0, "aborts": 0, "wasted_tokens": 0, "steps": 0,
            "context_cut": 0, "prompt_tokens": 0, "cached_tokens": 0, "tokens": 0, "max_in_flight": 0}


class _Worker:
    """A daemon thread that runs one engine's steps, so a hung step can be timed out (never joined)."""

    def __init__(self, name: str):
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.threads = torch.get_num_threads()  # OpenMP settings are per thread: give the worker the caller's
        threading.Thread(target=self._loop, name=f"vllm-{name}-steps", daemon=True).start()

    def _loop(self) -> None:
        # OpenMP's thread count is per calling thread; vLLM's CPU worker set the caller's (and replaced
        # torch.set_num_threads by a no-op), and its attention kernels check that they run with that count.
        set_threads = getattr(torch._C, "set_num_threads", None)
        if set_threads is not None:
            set_threads(self.threads)
        while True:
            fn = self.inbox.get()
            try:
                self.outbox.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it with context
                self.outbox.put((False, e))

    def submit(self, fn) -> None:
        self.inbox.put(fn)

    def result(self, timeout_s: float):
        return self.outbox.get(timeout=timeout_s)


class TurnDriver:
    """Plays word/bernoulli/chunk rollouts on two ``vllm.LLMEngine`` step loops (see the module doc).

    ``engines``: ``{True: senior_engine, False: junior_engine}`` with ``add_request``, ``step``,
    ``abort_request`` and ``has_unfinished_requests``; ``make_params(sampling, max_tokens, stop_ids, seed)``
    builds a request's sampling parameters. The engines must not be used by anyone else meanwhile.
    """

    def __init__(self, engines: dict, make_params, *, eos: set[int], max_model_len: int | None = None,
                 max_in_flight: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, turn_stop: str = "abort",
                 concurrent: bool | None = None):
        if turn_stop not in TURN_STOPS:
            raise ValueError(f"turn_stop must be one of {', '.join(TURN_STOPS)}, got {turn_stop!r}")
        if timeout_s <= 0:
            raise ValueError(f"the vLLM step timeout must be > 0 s, got {timeout_s}")
        self.engines, self.make_params, self.eos = engines, make_params, set(eos)
        self.max_model_len, self.max_in_flight = max_model_len, max_in_flight
        self.timeout_s, self.turn_stop = timeout_s, turn_stop
        # In-process engines: one thread for every engine call (vLLM keeps its forward context in a
        # process-wide global, so two of them must not step at the same time). Engines whose cores run in
        # their own processes (concurrent, detected unless given): one thread per engine, both steps wait at once.
        if concurrent is None:
            concurrent = all(is_multiprocess(e) for e in engines.values())
        self.concurrent = bool(concurrent)
        shared = None if self.concurrent else _Worker("engines")
        self.workers = {a: shared or _Worker(NAMES[a]) for a in engines}
        self.stats = _new_stats()
        self._n = 0

    def play(self, rows: list[Row], schedule: Schedule, sampling: Sampling, *, seed: int,
             max_rounds: int | None) -> dict:
        """Drive every row to its end; returns this call's counters (also kept in ``self.stats``)."""
        if schedule.name not in TURN_LEVEL:
            raise ValueError(f"the turn driver serves {', '.join(TURN_LEVEL)}, not {schedule.name!r}")
        self.stats = _new_stats()
        words = rows[0].sched.boundary_ids() if rows else []
        self._ctx = dict(schedule=schedule, sampling=sampling, seed=seed, max_rounds=max_rounds, words=words)
        ready, live = deque(range(len(rows))), {}
        start = time.perf_counter()
        while ready or live:
            cap = self.max_in_flight or len(rows)
            while ready and len(live) < cap:
                self._submit(rows, ready.popleft(), live)
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], len(live))
            if not live:
                continue
            for out in self._step_all(live):
                self._read(rows, out, live, ready)
        self.stats["wall_s"] = time.perf_counter() - start
        return self.stats

    def _room(self, row: Row) -> tuple[int, bool]:
        """Tokens this row may still write, and whether the engine's context (not the budget) limits it."""
        budget = self._ctx["sampling"].max_new_tokens - len(row.ids)
        if self.max_model_len is None:
            return budget, False
        ctx = self.max_model_len - len(row.prompt) - len(row.ids)
        return min(budget, ctx), ctx < budget

    def _submit(self, rows: list[Row], b: int, live: dict) -> None:
        row, c = rows[b], self._ctx
        room, by_ctx = self._room(row)
        if room <= 0:
            row.done = True
            self.stats["context_cut"] += int(by_ctx)
            return
        max_tokens, at_words = turn_limits(row.sched, room)
        stop_ids = sorted(self.eos)
        if at_words and self.turn_stop == "stop":
            stop_ids = sorted(self.eos | set(c["words"]))
        elif at_words:
            max_tokens = room  # the driver aborts the request at the first switching word start
        author = row.sched.author
        rid = f"t{self._n}r{b}"  # vLLM appends "-<random>" internally
        self._n += 1
        params = self.make_params(c["sampling"], max_tokens, stop_ids, c["seed"] * 1_000_003 + b * 7919 + row.requests)
        history = row.prompt + row.ids
        self._call(author, lambda: self.engines[author].add_request(rid, {"prompt_token_ids": history}, params))
        live[rid] = _Live(b, author)
        self.stats["same_author_requests"] += int(bool(row.owner) and row.owner[-1] == int(author))
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(history)
        row.requests += 1

    def _step_all(self, live: dict) -> list:
        """One step of every engine with requests in flight (on the shared engine thread in turn, or on each
        engine's own thread at once); all outputs."""
        busy = sorted({r.author for r in live.values()}, reverse=True)
        for a in busy:
            self.workers[a].submit(lambda e=self.engines[a]: step_ready(e))
        outs = []
        for a in busy:
            outs.extend(self._wait(a, "step"))
        self.stats["steps"] += 1
        return outs

    def _call(self, author: bool, fn, what: str = "add_request"):
        self.workers[author].submit(fn)
        return self._wait(author, what)

    def _wait(self, author: bool, what: str):
        """The engine thread's answer; EngineFault on an error, on no answer within ``timeout_s``, or as soon as
        the engine's core process (multiprocess engines) is seen dead."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                ok, value = self.workers[author].result(max(0.0, min(POLL_S, deadline - time.monotonic())))
                break
            except queue.Empty:
                dead = dead_process(self.engines[author])
                if dead:
                    raise EngineFault(f"the vLLM {NAMES[author]} engine died in {what} mid-rollout ({dead}); "
                                      "stopping the run, the last checkpoint is kept") from None
                if time.monotonic() >= deadline:
                    raise EngineFault(f"the vLLM {NAMES[author]} engine did not answer a {what} within "
                                      f"{self.timeout_s:g} s (rollout.vllm_timeout_s); stopping the run, "
                                      "the last checkpoint is kept") from None
        if not ok:
            raise EngineFault(f"the vLLM {NAMES[author]} engine failed in {what} mid-rollout: "
                              f"{type(value).__name__}: {value}; stopping the run, the last checkpoint is kept") from value
        return value

    def _read(self, rows: list[Row], out, live: dict, ready: deque) -> None:
        """Apply the schedule to a request's new tokens; end the turn where the author changes."""
        rid = out.request_id
        req = live.get(rid) or live.get(rid.rsplit("-", 1)[0])
        if req is None:
            return  # a late output of a request this driver already aborted
        key = rid if rid in live else rid.rsplit("-", 1)[0]
        row, c = rows[req.b], self._ctx
        toks = list(out.outputs[0].token_ids)[req.seen:]
        if req.seen == 0:  # the request's first output: how much of its prompt the prefix cache held
            self.stats["cached_tokens"] += int(getattr(out, "num_cached_tokens", 0) or 0)
        req.seen += len(toks)
        for i, tok in enumerate(toks):
            if self._take(row, req.b, tok):
                if not out.finished:
                    self._call(req.author, lambda: self.engines[req.author].abort_request([key]), "abort_request")
                    self.stats["aborts"] += 1
                self.stats["wasted_tokens"] += len(toks) - i - 1
                del live[key]
                if not row.done:
                    ready.append(req.b)
                return
        if out.finished:
            del live[key]
            if not toks and not row.done and req.seen == 0:
                row.done = True  # the engine returned nothing: never loop on an empty turn
            if not row.done:
                ready.append(req.b)

    def _take(self, row: Row, b: int, tok: int) -> bool:
        """Append ``tok`` as the current author's; True where the turn ends (author change or row end)."""
        c = self._ctx
        author = row.sched.author
        row.ids.append(int(tok))
        row.owner.append(int(author))
        row.turn.append(row.sched.decision())
        self.stats["tokens"] += 1
        row.sched.feed(int(tok))  # the coin after token t is draw t + 1 (as the in-process engine)
        switched = row.sched.author != author
        if int(tok) in self.eos:
            row.done = row.eos = True
        elif row.sched.over(c["max_rounds"]):
            row.done = True
        elif len(row.ids) >= c["sampling"].max_new_tokens:
            row.done = True
        elif self._room(row)[0] <= 0:
            row.done = True
            self.stats["context_cut"] += 1
        return switched or row.done


def turn_limits(sched: SequenceSchedule, room: int) -> tuple[int, bool]:
    """How far the current author may write in one request: ``(max_tokens, stop_at_word_starts)``.

    ``word``: up to the ``max_gap`` cap (:meth:`SequenceSchedule.max_turn_tokens`), ending at any word
    start. ``bernoulli``/``chunk`` (where a coin falls does not depend on the tokens): a copy of the
    row's schedule, fed stand-in tokens, finds the first coin that changes the author, the exact
    turn length. Never more than ``room`` tokens (at least 1).
    """
    if sched.schedule.name == "word":
        return max(1, min(room, sched.max_turn_tokens())), True
    probe = copy.copy(sched)  # shares the coin stream (draws are fixed per row and position)
    for k in range(1, room + 1):
        author = probe.author
        probe.feed(0)
        if probe.author != author:
            return k, False
    return max(1, room), False


def start_rows(prompts: list[list[int]], schedule: Schedule, coins: CoinStream) -> list[Row]:
    """One :class:`Row` per prompt, its first author from draw 0 (as :meth:`Schedule.start`)."""
    return [Row(list(p), SequenceSchedule(schedule, coins, b)) for b, p in enumerate(prompts)]


def generate_turns(engine, prompts: PromptBatch, schedule: Schedule, sampling: Sampling, *, seed: int,
                   max_rounds: int | None) -> Rollout:
    """:meth:`VLLMEngine.generate <tandem_rlvr.engines.vllm_backend.VLLMEngine.generate>` for word/bernoulli/chunk."""
    coins = schedule.coins(prompts.ids_BP.shape[0], seed)
    rows = start_rows(prompts.rows(), schedule, coins)
    driver = engine.turn_driver()
    stats = driver.play(rows, schedule, sampling, seed=seed, max_rounds=max_rounds)
    for k in ("requests", "same_author_requests", "aborts", "context_cut", "prompt_tokens", "tokens"):
        engine.turn_totals[k] = engine.turn_totals.get(k, 0) + stats[k]
    return rollout_from_rows(prompts.ids_BP, prompts.mask_BP, [r.ids for r in rows], [r.owner for r in rows],
                             pad_token_id=engine.pad, rounds=[r.rounds for r in rows],
                             finished=[r.eos for r in rows], max_rounds=max_rounds, schedule=schedule.name,
                             turn=[r.turn for r in rows])


def step_engine(llm):
    """The ``LLMEngine`` behind a ``vllm.LLM`` (anything with ``add_request``/``step`` passes through)."""
    if all(hasattr(llm, a) for a in ("add_request", "step", "abort_request")):
        return llm
    eng = getattr(llm, "llm_engine", None)
    if eng is None or not hasattr(eng, "step"):
        raise TypeError(f"{type(llm).__name__} has no vLLM step loop (llm_engine.add_request/step/abort_request)")
    return eng


def context_length(llm) -> int | None:
    """The engine's ``max_model_len``, where it can be read."""
    cfg = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(cfg, "max_model_len", None)
