"""The verifier pool: :class:`RewardScorer` scores batches under a hard per-check time limit.

Time limit: math-verify can take unbounded time on hostile input (``9^{9^{9^9}}``), partly inside C
code, and its ``signal.alarm`` timeouts fail off the main thread. So each check runs in a worker
process with math-verify's own timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``); the
worker stops itself after 85 % of the budget (``setitimer``) and the parent kills and replaces it at
the limit (default 2 s, counted from dispatch). A timed-out check scores 0 and is counted; checks
never raise and never hang. A pool whose workers cannot start at all (math-verify missing or broken, no
processes allowed) is no checker: :class:`~tandem_rlvr.errors.VerifierUnavailable`, not a batch of zeros.
Workers are never forked without exec (the trainer holds torch threads): by default each is a fresh
interpreter (``subprocess``, fork+exec like ``spawn``) that imports only ``tandem_rlvr.rewards.workers`` and
math-verify once, over a ``multiprocessing.connection`` socket. That also works
inside daemonic processes (DataLoader / Pool workers, where ``multiprocessing`` may not start
children) and, unlike the ``spawn`` / ``forkserver`` contexts (available via ``start_method``), does
not re-run the caller's ``__main__`` in every worker. The parent-side pre-check (no box, too long,
``boxed_exact``, two plain integers) is :func:`tandem_rlvr.rewards.extract.prepare_check`; the processes
themselves are :mod:`tandem_rlvr.rewards.workers`.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import sys
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Sequence
from multiprocessing import connection as mp_connection
from typing import Any

from tandem_rlvr.errors import VerifierUnavailable
from tandem_rlvr.names import REWARD_KINDS
from tandem_rlvr.rewards.extract import prepare_check
from tandem_rlvr.rewards.workers import HAS_PROC, Worker, rss_bytes, shutdown_workers

__all__ = ["DEFAULT_TIME_LIMIT", "RewardScorer"]

logger = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 2.0
MAX_COMPLETION_CHARS = 50_000  # longer completions are cut to this window around the last box
MAX_ANSWER_CHARS = 2_000  # a longer boxed answer (or gold) scores 0 without a worker round-trip
SOFT_LIMIT_FRACTION = 0.85
START_TIMEOUT = 60.0  # seconds a new worker may take to import math-verify and report ready
MEMORY_LIMIT_MB = 4096  # resident-memory cap of a worker (None: no cap); its address space is limited far above it
MEMORY_POLL_PARENT_S = 0.02  # how often the parent reads a busy worker's resident memory


class RewardScorer:
    """A persistent pool of verifier processes scoring batches under a hard per-check time limit.

    ``reward``: "math", "gsm8k" or "boxed_exact" (the latter needs no worker). ``time_limit``: seconds
    per check, measured from dispatch to a ready worker (start-up is not charged to a check); the
    worker gives up by itself after ``soft_limit_fraction`` of it, the parent kills it at the limit.
    ``start_method``: "subprocess" (default: a fresh interpreter that imports only the worker module),
    "spawn" or "forkserver" (these re-import the caller's ``__main__`` in every worker, so the
    caller's script needs an ``if __name__ == "__main__"`` guard; inside a daemonic process they fall
    back to "subprocess"). Thread-safe (calls are serialised); use as a context manager or call
    :meth:`close`; workers are also reaped at garbage collection and interpreter exit.
    """

    def __init__(
        self, reward: str = "math", *, num_workers: int | None = None, time_limit: float = DEFAULT_TIME_LIMIT,
        max_completion_chars: int | None = MAX_COMPLETION_CHARS, max_answer_chars: int | None = MAX_ANSWER_CHARS,
        start_method: str = "subprocess", memory_limit_mb: int | None = MEMORY_LIMIT_MB,
        start_timeout: float = START_TIMEOUT, soft_limit_fraction: float = SOFT_LIMIT_FRACTION,
    ) -> None:
        self.reward = _check_kind(reward)
        self.time_limit = _check_limit(time_limit)
        self.max_completion_chars, self.max_answer_chars = max_completion_chars, max_answer_chars
        self.start_timeout = float(start_timeout)
        self.soft_limit_fraction = _check_limit(soft_limit_fraction)
        self.method = _pick_method(start_method)
        n = num_workers if num_workers is not None else min(4, os.cpu_count() or 1)
        self._workers = [Worker(self.method, memory_limit_mb) for _ in range(max(1, int(n)))]
        self._lock = threading.Lock()
        self._closed, self._start_failures, self._restarts = False, 0, 0
        self._warned_text_gold = False  # one warning per scorer for a gold math-verify reads only as text
        self._start_error = ""  # why the last worker start failed (named when none can start)
        self.owner_pid = os.getpid()
        self.totals: Counter = Counter()
        self._finalizer = weakref.finalize(self, shutdown_workers, self._workers, self.owner_pid)

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers (bounded time, also while another thread scores); final."""
        self._closed = True  # a running score() stops dispatching within one time limit
        locked = self._lock.acquire(timeout=self.time_limit + 5.0)
        try:
            self._finalizer()
        finally:
            if locked:
                self._lock.release()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def start(self, wait: bool = True) -> None:
        """Start the workers now (they otherwise start at the first check); optionally wait until
        all report ready (bounded by ``start_timeout``)."""
        with self._lock:
            for w in self._workers:
                if w.conn is None:
                    self._restart(w, counted=False)
            end = time.monotonic() + self.start_timeout
            while wait and not all(w.ready or w.conn is None for w in self._workers):
                if time.monotonic() >= end:
                    break
                self._collect([])

    def score(
        self, completions: Sequence[Any], golds: Sequence[Any], *, reward: str | None = None,
        time_limit: float | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        """Score completions against golds; return (rewards, stats).

        ``stats`` (floats): ``reward/n``, ``reward/correct``, ``reward/mean``, ``time/reward_check_s`` (wall-clock seconds) and the
        counts ``reward/timeouts``, ``reward/errors``, ``reward/no_box``, ``reward/too_long``,
        ``reward/truncated``, ``reward/worker_restarts`` (and ``reward/bad_gold`` for an empty gold,
        ``reward/gold_text`` for a check whose gold math-verify read only as text, e.g. ``√2``: scored, but only
        the same text can match it; a warning names the first such gold);
        :attr:`totals` accumulates the counts. Identical (gold, answer) pairs are checked once.
        Never raises for a bad completion or a hanging check (those score 0 and are counted); raises
        ``ValueError`` for mismatched lengths or an unknown reward, ``RuntimeError`` once closed, and
        :class:`~tandem_rlvr.errors.VerifierUnavailable` when no worker can start (every check would score 0).
        """
        if len(completions) != len(golds):
            raise ValueError(f"score: {len(completions)} completions but {len(golds)} golds")
        kind = _check_kind(reward or self.reward)
        limit = _check_limit(time_limit if time_limit is not None else self.time_limit)
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardScorer is closed")
            t0 = time.perf_counter()
            rewards, stats = self._score_locked(kind, completions, golds, limit)
            stats["time/reward_check_s"] = time.perf_counter() - t0
        self.totals.update({k: v for k, v in stats.items() if k.startswith("reward/") and k != "reward/mean"})
        return rewards, stats

    def _score_locked(
        self, kind: str, completions: Sequence[Any], golds: Sequence[Any], limit: float
    ) -> tuple[list[float], dict[str, float]]:
        """Pre-filter in this process, dedupe identical (gold, pred) pairs, verify the rest."""
        rewards = [0.0] * len(completions)
        counts: Counter = Counter({k: 0 for k in ("timeouts", "no_box", "errors", "too_long", "truncated")})
        pairs: dict[tuple[str, str], list[int]] = {}
        for i, (comp, gold) in enumerate(zip(completions, golds)):
            try:
                final, status, pred, gold_s, cut = prepare_check(
                    kind, comp, gold, self.max_completion_chars, self.max_answer_chars
                )
            except Exception:  # noqa: BLE001 - never raise for a bad input
                final, status, cut = 0.0, "errors", False
            counts["truncated"] += int(cut)
            if final is not None:
                rewards[i] = final
                if status != "ok":  # a check settled here (boxed_exact, two plain integers) counts nothing
                    counts[status] += 1
            else:
                pairs.setdefault((gold_s, pred), []).append(i)
        jobs = list(pairs)
        for (status, value), key in zip(self._run_jobs(jobs, limit, kind) if jobs else [], jobs):
            for i in pairs[key]:
                rewards[i] = value
                if status != "ok":
                    counts[{"timeout": "timeouts", "error": "errors"}.get(status, status)] += 1
            if status == "gold_text" and not self._warned_text_gold:
                self._warned_text_gold = True
                logger.warning(
                    "rewards: math-verify reads the gold answer %r only as text, not as math (Unicode math such as "
                    "√2, ½, 90° or x² does this): only the same text matches it, so an answer of equal value in "
                    "LaTeX scores 0. Such checks are counted as reward/gold_text; write the golds in LaTeX "
                    "(\\sqrt{2}, \\frac{1}{2}, 90^\\circ).", key[0][:80])
        stats = {f"reward/{k}": float(v) for k, v in counts.items()}
        stats["reward/worker_restarts"], self._restarts = float(self._restarts), 0
        stats["reward/n"] = float(len(rewards))
        stats["reward/correct"] = float(sum(r > 0 for r in rewards))
        stats["reward/mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        return rewards, stats

    # -- the pool -----------------------------------------------------------------------------------

    def _restart(self, w: Worker, counted: bool = True) -> None:
        w.kill()
        self._restarts += int(counted)
        if self._closed:
            return
        try:
            w.start()
        except Exception as e:  # noqa: BLE001 - e.g. no processes allowed; counted as a start failure
            logger.warning("rewards: could not start a verifier worker: %s", e)
            w.kill()
            self._start_failures += 1
            self._start_error = f"{type(e).__name__}: {e}"

    def _run_jobs(self, jobs: list[tuple[str, str]], limit: float, kind: str) -> list[tuple[str, float]]:
        """Verify (gold, pred) pairs on the pool; (status, score) per pair; never hangs, and raises only when no
        worker can start (:meth:`_unavailable`)."""
        results: list[tuple[str, float] | None] = [None] * len(jobs)
        self._start_failures = 0  # every batch tries again to get workers
        for w in self._workers:
            if w.conn is None:
                self._restart(w, counted=False)
        pending = deque(range(len(jobs)))
        soft = max(0.05, self.soft_limit_fraction * limit)
        while pending or any(w.job is not None for w in self._workers):
            if self._closed:  # close() from another thread (the watchdog): the process is ending
                logger.error("rewards: verifier closed; %d checks scored 0", len(pending))
                break
            if self._start_failures > 2 * len(self._workers):
                self._unavailable(kind, len(pending) + sum(w.job is not None for w in self._workers))
            now = time.monotonic()
            for w in self._workers:
                if pending and w.ready and w.job is None:
                    k = pending.popleft()
                    if w.send((k, jobs[k][0], jobs[k][1], soft)):
                        w.job, w.deadline = k, now + limit
                    else:
                        pending.appendleft(k)
                        self._restart(w)
            self._collect(results)
            self._expire(results)
        return [r if r is not None else ("error", 0.0) for r in results]

    def _unavailable(self, kind: str, unchecked: int) -> None:
        """Every worker failed to start, twice over: stop the workers and raise naming the reward and the cause."""
        for w in self._workers:
            w.kill()
        raise VerifierUnavailable(
            f"reward {kind!r}: the answer checker is unavailable, no verifier worker could start "
            f"({self._start_error or 'cause unknown'}); {unchecked} answer(s) not checked. Does "
            f"`{sys.executable} -c 'import math_verify'` work?")

    def _collect(self, results: list) -> None:
        """Wait until a worker answers, a deadline passes or a start times out; record answers."""
        live = [w for w in self._workers if w.conn is not None and (w.job is not None or not w.ready)]
        if not live:
            if not any(w.conn is not None for w in self._workers):
                self._start_failures += 1
                for w in self._workers:
                    self._restart(w, counted=False)
            return
        ends = [w.deadline if w.job is not None else w.started_at + self.start_timeout for w in live]
        timeout = max(0.0, min(ends) - time.monotonic())
        if HAS_PROC and any(w.job is not None and w.memory_limit_mb for w in live):
            timeout = min(timeout, MEMORY_POLL_PARENT_S)  # wake to read the busy workers' memory
        by_conn = {id(w.conn): w for w in live}
        try:
            ready = mp_connection.wait([w.conn for w in live], timeout=timeout)
        except (OSError, ValueError):  # a connection closed under us (close() from another thread)
            return
        for conn in ready:
            w = by_conn[id(conn)]
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the worker died (out of memory, or it could not start)
                if w.job is not None:
                    results[w.job] = ("error", 0.0)
                if not w.ready:
                    self._start_failures += 1
                    self._start_error = "a worker exited before it was ready; its error is printed above"
                self._restart(w, counted=w.ready)
                continue
            if msg[0] == "ready":
                w.ready, self._start_failures = True, 0
            elif w.job is not None and msg[0] == w.job:
                results[w.job] = (msg[1], msg[2])
                w.job = None
        self._over_memory(results)

    def _over_memory(self, results: list) -> None:
        """A busy worker whose resident memory passed its cap is killed, its check an error, and replaced.
        Read from here because the worker's own guard thread cannot run while a check holds its GIL."""
        for w in self._workers:
            if w.job is None or not w.memory_limit_mb or w.proc is None or w.conn is None:
                continue
            rss = rss_bytes(w.proc.pid)
            # an answer in by the end of the reading is read by the next wait, never discarded
            if rss is not None and rss > w.memory_limit_mb * 2**20 and not _answered(w):
                results[w.job] = ("error", 0.0)
                self._restart(w)

    def _expire(self, results: list) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.job is not None and now >= w.deadline:
                results[w.job] = ("timeout", 0.0)
                self._restart(w)
            elif w.conn is not None and not w.ready and now >= w.started_at + self.start_timeout:
                logger.warning("rewards: a verifier worker did not start within %.0f s", self.start_timeout)
                self._start_failures += 1
                self._start_error = f"no worker was ready within start_timeout {self.start_timeout:g} s"
                self._restart(w, counted=False)


def _answered(w: Worker) -> bool:
    """Whether ``w``'s connection holds a message not read yet (or cannot be polled: left to the next wait)."""
    try:
        return bool(w.conn.poll())
    except (OSError, EOFError, ValueError):
        return True


def _check_kind(kind: str) -> str:
    if kind not in REWARD_KINDS:
        raise ValueError(f"unknown reward {kind!r}; valid: {', '.join(REWARD_KINDS)}")
    return kind


def _check_limit(limit: float) -> float:
    limit = float(limit)
    if not (limit > 0 and math.isfinite(limit)):
        raise ValueError(f"time_limit must be a positive number of seconds, got {limit!r}")
    return limit


def _pick_method(method: str) -> str:
    if method not in ("subprocess", "spawn", "forkserver"):
        raise ValueError(f"start_method must be subprocess, spawn or forkserver, got {method!r}")
    if method != "subprocess" and multiprocessing.current_process().daemon:
        return "subprocess"  # multiprocessing refuses to start children of a daemonic process
    return method
