"""Answer extraction, parent side and in linear time: the last box of a completion, the GSM8K gold
and prediction, and the cheap pre-check that settles every check needing no verifier.

A reward takes the last ``\\boxed{...}`` (also ``\\fbox{...}``, ``\\boxed x``) of a completion and
checks it against the gold answer: ``math`` with math-verify (in a worker process, see
:mod:`tandem_rlvr.rewards.scorer`), ``gsm8k`` likewise with the gold after ``####`` (and a final
``#### N`` line accepted when there is no box), ``boxed_exact`` by string equality without
whitespace. :func:`prepare_check` decides no box, too long, a bad gold, ``boxed_exact`` and a ``math``
or ``gsm8k`` check of two plain integers here, without any worker round-trip.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Prepared", "extract_boxed", "gsm8k_gold", "prepare_check"]

# Tokens that matter for brace matching: an escaped backslash (so ``\\{`` is a line break + group),
# a box opener with its brace, a bare box command (``\boxed 5``), escaped braces, plain braces.
_TOKEN_RE = re.compile(r"\\\\|\\(?:boxed|fbox)\s*\{|\\(?:boxed|fbox)(?![A-Za-z])|\\[{}]|[{}]")
_BARE_ARG_RE = re.compile(r"[ \t]+([^\s$]{1,200})")
# A plain integer in canonical form (no sign on 0, no leading zero, no space), at most 15 digits: two such
# strings are equal numbers exactly when they are equal strings, and math-verify agrees on every pair
# (tests/rewards/test_rewards.py checks it), so such a check needs no worker.
_PLAIN_INT_RE = re.compile(r"0|-?[1-9][0-9]{0,14}")


def extract_boxed(text: str) -> str | None:
    """Return the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``.

    Braces nest; escaped braces (``\\{``, ``\\}``) do not count. "Last" is the box that closes last; a
    box whose content is just another box (``\\boxed{\\boxed{3}}``) yields the inner content. An
    unterminated box (a truncated generation) is ignored, so the last *complete* box counts. The
    content is stripped of surrounding whitespace and may be ``""`` (``\\boxed{}``). ``None``: no box.
    """
    if not isinstance(text, str) or ("\\boxed" not in text and "\\fbox" not in text):
        return None
    depth, stack = 0, []  # stack: (token_start, content_start, depth at the opener)
    last: tuple[int, int, int, int] | None = None  # (token_start, close_end, eff_start, eff_end)
    for m in _TOKEN_RE.finditer(text):
        tok = m.group()
        if tok[-1] == "{" and len(tok) > 2:  # box opener
            stack.append((m.start(), m.end(), depth))
            depth += 1
        elif tok.startswith(("\\boxed", "\\fbox")):  # bare form: \boxed 5
            arg = _BARE_ARG_RE.match(text, m.end())
            if arg:
                last = (m.start(), arg.end(), arg.start(1), arg.end(1))
        elif tok == "{":
            depth += 1
        elif tok == "}" and depth > 0:
            depth -= 1
            if stack and stack[-1][2] == depth:
                start, cs, _ = stack.pop()
                eff = (cs, m.start())
                if last is not None and _only_space(text, cs, last[0]) and _only_space(text, last[1], m.start()):
                    eff = (last[2], last[3])  # the content is exactly the previous (inner) box
                last = (start, m.end(), *eff)
    return None if last is None else text[last[2] : last[3]].strip()


def _only_space(text: str, start: int, end: int) -> bool:
    return start <= end and (start == end or text[start:end].isspace())


def _as_text(completion: Any) -> str:
    """Accept a string, or a TRL conversational completion (list of message dicts): last content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return "" if completion is None else str(completion)


def _window_around_last_box(text: str, max_chars: int | None) -> tuple[str, bool]:
    """Cut an absurdly long text to ``max_chars`` around its last box opener; (text, was_cut)."""
    if max_chars is None or len(text) <= max_chars:
        return text, False
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return text[-max_chars:], True
    lo = max(0, i - max_chars // 4)
    return text[lo : lo + max_chars], True


def gsm8k_gold(gold: str) -> str:
    """GSM8K gold answer: the text after the last ``####`` (or the whole string), commas removed."""
    return str(gold).rsplit("####", 1)[-1].strip().replace(",", "")


_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_HASH_LINE_RE = re.compile(r"####[ \t]*([^\n]*)")


def _gsm8k_pred(text: str) -> str | None:
    """GSM8K prediction: last box, else the last ``#### N`` line; thousands separators removed."""
    pred = extract_boxed(text)
    if pred is None:
        i = text.rfind("####")
        m = _HASH_LINE_RE.match(text, i) if i >= 0 else None
        pred = m.group(1).strip() if m else None
    return None if pred is None else _THOUSANDS_RE.sub("", pred)


def _gold_answer(gold: Any) -> str:
    """A gold answer string; a gold that itself contains a box is reduced to its last box."""
    text = "" if gold is None else str(gold).strip()
    boxed = extract_boxed(text) if "\\boxed" in text or "\\fbox" in text else None
    return text if boxed is None else boxed


Prepared = tuple[float | None, str, str | None, str, bool]


def prepare_check(
    kind: str, completion: Any, gold: Any, max_chars: int | None, max_answer: int | None
) -> Prepared:
    """Cheap parent-side step: (final_score | None, status, pred, gold, truncated).

    ``final_score`` is set when no worker is needed (no box, too long, bad gold, ``boxed_exact``, and two
    plain integers: equal strings score 1, others 0, as math-verify would).
    """
    text, cut = _window_around_last_box(_as_text(completion), max_chars)
    if kind == "gsm8k":
        gold_s, pred = gsm8k_gold(gold), _gsm8k_pred(text)
    else:
        gold_s, pred = _gold_answer(gold), extract_boxed(text)
    if not gold_s:
        return 0.0, "bad_gold", pred, gold_s, cut
    if not pred:  # a box cut open by the window above was absurdly long, not missing
        status = "too_long" if cut and ("\\boxed" in text or "\\fbox" in text) else "no_box"
        return 0.0, status, pred, gold_s, cut
    if kind == "boxed_exact":
        same = "".join(pred.split()) == "".join(gold_s.split())
        return (1.0 if same else 0.0), "ok", pred, gold_s, cut
    if max_answer is not None and (len(pred) > max_answer or len(gold_s) > max_answer):
        return 0.0, "too_long", pred, gold_s, cut
    if _PLAIN_INT_RE.fullmatch(pred) and _PLAIN_INT_RE.fullmatch(gold_s):
        return (1.0 if pred == gold_s else 0.0), "ok", pred, gold_s, cut
    return None, "verify", pred, gold_s, cut
