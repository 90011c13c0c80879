"""The reward functions by name, scored on one shared process-wide :class:`RewardScorer`, and user
rewards by import path.

``math_reward``, ``gsm8k_reward`` and ``boxed_exact_reward`` score one completion each on a scorer
that this process starts at the first call (two workers; a new one after a fork) and closes at exit;
:data:`REWARD_FNS` / :func:`get_reward_fn` name them, :func:`score_batch` scores a batch on the same
pool and :func:`reward_totals` reads its counters. :func:`import_reward` loads a user reward
``"package.module:function"`` or ``"path/to/file.py:function"``.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tandem_rlvr.errors import TandemError
from tandem_rlvr.rewards.scorer import RewardScorer

__all__ = [
    "REWARD_FNS", "boxed_exact_reward", "from_trl_signature", "get_reward_fn", "gsm8k_reward", "import_reward",
    "math_reward", "reward_totals", "score_batch",
]

_DEFAULT: RewardScorer | None = None
_DEFAULT_LOCK = threading.Lock()


def _default_scorer() -> RewardScorer:
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT.closed or _DEFAULT.owner_pid != os.getpid():  # fork: not ours
            _DEFAULT = RewardScorer("math", num_workers=2)
        return _DEFAULT


def _close_default() -> None:
    if _DEFAULT is not None:
        _DEFAULT.close()


atexit.register(_close_default)


def _score_one(kind: str, completion: Any, gold: Any, time_limit: float | None) -> float:
    # no box etc. is decided in this process; only a real check makes a worker round-trip
    rewards, _ = _default_scorer().score([completion], [gold], reward=kind, time_limit=time_limit)
    return rewards[0]


def math_reward(completion: Any, gold: Any, *, time_limit: float | None = None, **kwargs: Any) -> float:
    """1.0 if the last boxed answer of ``completion`` is math-equivalent to ``gold``, else 0.0.

    Equivalence is math-verify's (fractions, decimals, percentages, sets, intervals, ``x=3`` vs ``3``,
    ``\\dfrac``, units, ``^\\circ``, LaTeX spacing). No box → 0. At most ``time_limit`` seconds
    (default 2) per check from any thread or process; a timeout scores 0 and is counted in
    :func:`reward_totals`. Extra keyword arguments are accepted and ignored. One completion a call: it
    does not take TRL's batch arguments (``completions=``, columns as lists); under TRL's ``GRPOTrainer``
    use ``tandem_rlvr.trl.reward("math")``. ``completion`` may also be a TRL conversational list of messages.
    """
    return _score_one("math", completion, gold, time_limit)


def gsm8k_reward(completion: Any, gold: Any, *, time_limit: float | None = None, **kwargs: Any) -> float:
    """GSM8K reward: gold after ``####`` (commas stripped) vs the last box, or, without a box, the
    completion's last ``#### N`` line; compared with math-verify under the same time limit. Extra
    keyword arguments are ignored."""
    return _score_one("gsm8k", completion, gold, time_limit)


def boxed_exact_reward(completion: Any, gold: Any, **kwargs: Any) -> float:
    """1.0 if the last boxed answer equals ``gold`` (or gold's last box) as strings with all whitespace
    removed; no math-verify, no worker. Extra keyword arguments are ignored."""
    return _score_one("boxed_exact", completion, gold, None)


REWARD_FNS: dict[str, Callable[..., float]] = {
    "math": math_reward, "gsm8k": gsm8k_reward, "boxed_exact": boxed_exact_reward
}


def get_reward_fn(name: str) -> Callable[..., float]:
    """The reward function registered under ``name`` ("math", "gsm8k", "boxed_exact")."""
    try:
        return REWARD_FNS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reward {name!r}; valid: {', '.join(sorted(REWARD_FNS))}") from None


def score_batch(
    completions: Sequence[Any], golds: Sequence[Any], *, reward: str = "math", time_limit: float | None = None
) -> tuple[list[float], dict[str, float]]:
    """Score a batch on the shared process-wide pool; see :meth:`RewardScorer.score`."""
    return _default_scorer().score(completions, golds, reward=reward, time_limit=time_limit)


def reward_totals() -> dict[str, float]:
    """Cumulative ``reward/...`` counters of the shared scorer (used by the single-call rewards)."""
    return dict(_DEFAULT.totals) if _DEFAULT is not None else {}


def import_reward(spec: str):
    """A user reward ``"package.module:function"`` or ``"path/to/file.py:function"`` (a plain
    ``(completion, gold) -> float``, or a TRL-style reward, see :func:`from_trl_signature`), or None for the
    built-in names, which are scored with a hard time limit in worker processes. A relative file path is
    read from the current directory (:func:`tandem_rlvr.config.load_config` has already made a config
    file's path absolute, against that file's directory). Any failure is one :class:`TandemError` line
    naming ``data.reward``."""
    if ":" not in spec:
        return None
    from tandem_rlvr.data_keys import is_reward_file

    if is_reward_file(spec):
        path, _, attr = spec.rpartition(":")
        module, where = _import_file(spec, path), path
    else:
        import importlib

        mod_name, _, attr = spec.partition(":")
        try:
            module, where = importlib.import_module(mod_name), mod_name
        except Exception as e:  # noqa: BLE001 - the user's module: a missing name, a SyntaxError, its own error
            raise TandemError(f"data.reward {spec!r} cannot be imported: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None) if attr else None
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise TandemError(f"data.reward {spec!r}: {where} has no function {attr!r} "
                          f"(it defines: {', '.join(defined) or 'no function'})")
    if not callable(fn):
        raise TandemError(f"data.reward {spec!r} is not callable")
    return from_trl_signature(fn, spec) if _takes_completions(fn) else fn


def _import_file(spec: str, path: str):
    """The module of the Python file ``path``, executed once per process (a later call reuses it) under a
    name of its own (``tandem_rlvr_user_reward_<stem>_<hash of the path>``); its folder is not put on sys.path."""
    import hashlib
    import importlib.util
    import sys
    from pathlib import Path

    file = Path(path).expanduser().resolve()  # a/../r.py and r.py (or a link to it) are one module
    if not file.is_file():
        raise TandemError(f"data.reward {spec!r}: no such file {str(file)!r}")
    name = f"tandem_rlvr_user_reward_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise TandemError(f"data.reward {spec!r}: {str(file)!r} is not a Python file (name it *.py)")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while and after it runs
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: any error, one line
        del sys.modules[name]
        raise TandemError(f"data.reward {spec!r}: importing {str(file)!r} failed: {type(e).__name__}: {e}") from None
    return module


def _takes_completions(fn) -> bool:
    import inspect

    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a readable signature: called as ours
        return False


def from_trl_signature(fn: Callable[..., Sequence[Any]], name: str = "") -> Callable[[Any, Any], float]:
    """A TRL-style batch reward ``fn(prompts=, completions=, completion_ids=, **columns) -> list[float]``
    (recognised by its parameter ``completions``) as our ``(completion, gold) -> float``: one completion
    (text) a call, the gold answer passed as the columns ``answer`` and ``solution`` (TRL's
    ``accuracy_reward`` reads ``solution``), ``prompts`` and ``completion_ids`` as ``[None]``, ``trainer_state``
    None. A None reward (TRL: "not applicable") is NaN, which the trainer refuses."""
    name = name or getattr(fn, "__name__", "reward")

    def reward(completion: Any, gold: Any) -> float:
        out = list(fn(prompts=[None], completions=[completion], completion_ids=[None], answer=[gold], solution=[gold],
                      trainer_state=None))
        if len(out) != 1:
            raise TandemError(f"data.reward {name!r} returned {len(out)} rewards for one completion")
        return float("nan") if out[0] is None else float(out[0])

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward
