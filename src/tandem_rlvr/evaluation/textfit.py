"""Text chains of the evaluation's cross-tokenizer bridges (the step and word bridges of
:mod:`tandem_rlvr.evaluation.crosstok` and :mod:`tandem_rlvr.evaluation.wordbridge`): per-row texts,
owner spans, authors and rounds; fitting a turn's input into the context and a row's text into the
senior's token budget."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from tandem_rlvr.engines.bridge import append_owned_text


@dataclass
class _Chains:
    """Per-row state of an evaluation bridge. Unlike :class:`tandem_rlvr.engines.bridge._Chains` (whose
    rows follow a :class:`~tandem_rlvr.engines.handoff.SequenceSchedule`), these rows follow the
    evaluation's own turn rules (strict alternation; word coins drawn in each author's vocabulary)."""

    texts: list[str]
    spans: list[list[list[int]]]
    author: list[bool]
    rounds: list[int]
    remaining: list[int]
    done: list[bool]
    finished: list[bool]
    last_author: list[bool]

    @classmethod
    def start(cls, n: int, author: list[bool], budget: int) -> _Chains:
        """``n`` empty chains with their first authors and the whole budget each."""
        return cls([""] * n, [[] for _ in range(n)], list(author), [1] * n, [budget] * n,
                   [False] * n, [False] * n, list(author))

    @property
    def sched(self) -> list[SimpleNamespace]:
        """Each row's round count, as :func:`tandem_rlvr.engines.bridge._to_rollout` reads it."""
        return [SimpleNamespace(rounds=r) for r in self.rounds]

    def add_text(self, b: int, text: str, owner: int) -> None:
        """Append ``text`` to row ``b``, extending its last span when the owner is unchanged."""
        append_owned_text(self.texts, self.spans, b, text, owner)


def _fit_context(seqs: list[list[int]], caps: list[int], context: int | None) -> tuple[list, list, int]:
    """Left-truncate each input so that input + turn fits ``context``; returns (seqs, caps, n cut)."""
    if context is None:
        return seqs, caps, 0
    out_s, out_c, cut = [], [], 0
    for s, c in zip(seqs, caps):
        c = max(1, min(c, context // 2)) if len(s) + c > context else c
        keep = context - c
        cut += int(len(s) > keep)
        out_s.append(s[-keep:] if len(s) > keep else s)
        out_c.append(c)
    return out_s, out_c, cut


def _trim(ch: _Chains, b: int, cut: int) -> None:
    """Cut row ``b``'s text (and its owner spans) to its first ``cut`` characters."""
    ch.texts[b] = ch.texts[b][:cut]
    ch.spans[b] = [[s, min(e, cut), o] for s, e, o in ch.spans[b] if s < cut]


def _fit_cut(tok, text: str, offs, budget: int) -> int:
    """The longest prefix (in characters) that ends at a token end and re-encodes to <= ``budget`` tokens."""
    cut = int(offs[budget - 1][1]) if budget > 0 else 0
    while cut > 0 and len(tok(text[:cut], add_special_tokens=False)["input_ids"]) > budget:
        cut -= 1  # a character split over several byte tokens re-encodes whole: step back
    return cut


def _senior_used(ch: _Chains, rows: list[int], tok, budget: int) -> list[int | None]:
    """Senior tokens of each row's text; a row that passes ``budget`` is cut at its last fitting token (None)."""
    enc = tok([ch.texts[b] for b in rows], add_special_tokens=False, return_offsets_mapping=True)
    used: list[int | None] = []
    for b, ids, offs in zip(rows, enc["input_ids"], enc["offset_mapping"]):
        if len(ids) > budget:
            _trim(ch, b, _fit_cut(tok, ch.texts[b], offs, budget))
        used.append(len(ids) if len(ids) <= budget else None)
    return used
