"""The checks of the ``data`` and ``val`` sections at config load (:func:`tandem_rlvr.config.validate`; the prompt
keys' also for ``tandem-rlvr eval``) and the one path resolved there (a reward file). Imports nothing heavy, as :mod:`tandem_rlvr.config`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem_rlvr.prompts import template_problem

__all__ = ["data_checks", "is_reward_file", "kwargs_problem", "prompt_checks", "reward_path", "select_k"]


def data_checks(cfg: Any) -> list[tuple[bool, str, str | None]]:
    """``(ok, key, why)`` of the data and val sections: the reward's form, the validation keys, the prompt keys
    (a template with {problem}, not with a prompt column; ``chat_template_kwargs`` a mapping of names)."""
    from tandem_rlvr.names import REWARD_KINDS

    d, v = cfg.data, cfg.val
    k = select_k(v.select)
    return [
        (v.every == 0 or bool(v.data), "val.data", "is required when val.every > 0"),
        (k is not None and k <= v.n, "val.select",
         f"must be pass@K with K in 1, 2, 4, 8 and K <= val.n ({v.n}), got {v.select!r}"),
        (d.reward in REWARD_KINDS or ":" in d.reward, "data.reward",
         f"must be {', '.join(REWARD_KINDS)} or package.module:function (or path/to/file.py:function), got {d.reward!r}"),
        *[(ok, f"data.{name}", why) for ok, name, why in prompt_checks(d, lambda n: f"data.{n}")],
    ]


def prompt_checks(d: Any, key: Callable[[str], str]) -> list[tuple[bool, str, str | None]]:
    """``(ok, field name, why)`` of the prompt keys of ``d`` (the data section, or the eval options, which share
    their names): a template with {problem}, not with a prompt column; ``chat_template_kwargs`` a mapping of
    names. ``key(name)`` names another key in a reason (``data.prompt_key``, ``--prompt-key``)."""
    kw = d.chat_template_kwargs
    return [
        (template_problem(d.prompt_template) is None, "prompt_template", template_problem(d.prompt_template)),
        (not (d.prompt_template and d.prompt_key), "prompt_template",
         f"does not apply to a prompt column ({key('prompt_key')}={d.prompt_key!r} holds the whole prompt); unset one"),
        (not (why := kwargs_problem(kw)), "chat_template_kwargs", why),
    ]


def kwargs_problem(kw: Any) -> str:
    """Why ``chat_template_kwargs`` cannot go to ``apply_chat_template`` ('' when it can): a mapping of argument
    names (identifiers) to values. YAML reads ``{enable_thinking:false}`` (no space after the colon) as the key
    ``'enable_thinking:false'`` with no value, which the template would silently ignore."""
    if not isinstance(kw, dict):
        return f"must be a mapping of argument names to values, e.g. {{enable_thinking: false}}, got {kw!r}"
    for name, value in kw.items():
        if not (isinstance(name, str) and name.isidentifier()):
            what = "is not an argument name"
        elif value is None:
            what = "has no value"
        else:
            continue
        return (f"must map argument names to values, e.g. {{enable_thinking: false}}: {name!r} {what} (write "
                f"`key: value`, with a space after the colon), got {kw!r}")
    return ""


def select_k(select: str) -> int | None:
    """K of a ``val.select`` value ``pass@K`` (K in 1, 2, 4, 8: the pass@k validation computes), else None."""
    head, _, k = str(select).partition("@")
    return int(k) if head == "pass" and k in ("1", "2", "4", "8") else None


def is_reward_file(spec: str) -> bool:
    """``spec`` names a file (``path/to/file.py:function``: the part before the last ``:`` ends in ``.py`` or
    holds a path separator), not a module (``package.module:function``)."""
    module, sep, _ = spec.rpartition(":")
    return bool(sep) and (module.endswith(".py") or "/" in module or "\\" in module)


def reward_path(d: Any, base: Path) -> None:
    """``d.reward`` = ``path/to/file.py:function`` with a relative (or ``~``) path: made absolute against
    ``base`` (the config file's directory, or the current directory for overrides), so the run, its saved
    config.yaml and every process import the same file."""
    if is_reward_file(d.reward):
        module, _, fn = d.reward.rpartition(":")
        d.reward = f"{os.path.abspath(base / Path(module).expanduser())}:{fn}"
