"""Prompts and math problem sets: named hub benchmarks, local files and the built-in world.

Every loader returns ``list[Example]`` (``id``, ``problem``, ``answer`` as strings). Rows whose
problem or answer is missing or empty, or whose problem exceeds ``max_problem_chars``, are skipped
and counted in a one-line ``logging`` warning; anything that makes a whole source unusable (missing
file, bad encoding or syntax, missing column, no usable row, unknown name, unreachable hub) raises
:class:`DataError` naming the culprit.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_rlvr.errors import DataError  # noqa: F401 (raised here; also importable from here)

__all__ = [
    "BENCHMARKS",
    "FILE_SUFFIXES",
    "MAX_PROBLEM_CHARS",
    "PLAIN_PROMPT_TEMPLATE",
    "PROMPT_SUFFIX",
    "BenchmarkSpec",
    "DataError",
    "Example",
    "HubSource",
    "build_user_turn",
    "holdout_indices",
    "load_examples",
    "render_prompt",
]

logger = logging.getLogger(__name__)

PROMPT_SUFFIX = (
    " Solve the following math problem step by step. Put your final answer inside \\boxed{}, "
    "like \\boxed{42} or \\boxed{\\frac{1}{2}}."
)
# Used when a tokenizer has no chat template (a base model): the user turn, then "Answer:".
PLAIN_PROMPT_TEMPLATE = "Question: {user_turn}\nAnswer:"
MAX_PROBLEM_CHARS = 100_000
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
ANSWER_FORMATS = ("plain", "gsm8k")



@dataclass(frozen=True)
class Example:
    """One math problem with its gold answer."""

    id: str
    problem: str
    answer: str


# --------------------------------------------------------------------------------------------------
# Prompts


def build_user_turn(problem: str) -> str:
    """The single user turn of the paper's prompt: the problem text followed by :data:`PROMPT_SUFFIX`."""
    return problem + PROMPT_SUFFIX


def render_prompt(tokenizer: Any, problem: str) -> str:
    """The prompt string for ``problem``: the tokenizer's chat template with one user turn and the
    generation prompt (no system prompt), or, for a tokenizer without a chat template,
    :data:`PLAIN_PROMPT_TEMPLATE` (``"Question: <user turn>\\nAnswer:"``)."""
    user_turn = build_user_turn(problem)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_turn}], add_generation_prompt=True, tokenize=False
        )
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    if name not in _WARNED_PLAIN:  # once per tokenizer, not once per prompt
        _WARNED_PLAIN.add(name)
        logger.warning("data: tokenizer %r has no chat template; using the plain prompt %r", name, PLAIN_PROMPT_TEMPLATE)
    return PLAIN_PROMPT_TEMPLATE.format(user_turn=user_turn)


_WARNED_PLAIN: set[str] = set()


# --------------------------------------------------------------------------------------------------
# Benchmark specs


@dataclass(frozen=True)
class HubSource:
    """One Hugging Face hub dataset split and the names of its columns."""

    path: str
    split: str
    problem_key: str
    answer_key: str
    id_key: str | None = None
    config: str | None = None
    tag: str = ""  # id prefix within a benchmark made of several sources


@dataclass(frozen=True)
class BenchmarkSpec:
    """A named problem set: hub sources per public split, answer format and an optional hold-out.

    ``splits`` maps each public split name to the tuple of sources it concatenates. With
    ``holdout`` > 0, split ``holdout_split`` is ``holdout`` rows drawn from the rows of
    ``holdout_of`` by :func:`holdout_indices` (seed ``holdout_seed``) and ``holdout_of`` keeps the rest.
    """

    name: str
    splits: Mapping[str, tuple[HubSource, ...]]
    default_split: str
    answer_format: str = "plain"
    holdout: int = 0
    holdout_seed: int = 0
    holdout_split: str = "val"
    holdout_of: str = "train"


def _one(source: HubSource, *splits: str) -> dict[str, tuple[HubSource, ...]]:
    return {s: (source,) for s in splits}


BENCHMARKS: dict[str, BenchmarkSpec] = {
    # Training set (≈40.3k rows, one hub split "train" with problem/answer/solution); 1,000 rows are
    # held out for checkpoint selection as the paper's authors chose them (holdout_indices: rows with an
    # answer, then DataFrame.sample(n=1000, random_state=0)).
    "deepscaler": BenchmarkSpec(
        "deepscaler",
        _one(HubSource("agentica-org/DeepScaleR-Preview-Dataset", "train", "problem", "answer"), "train", "val"),
        default_split="train",
        holdout=1000,
        holdout_seed=0,
    ),
    # 30 problems, columns id/problem/solution/answer/url/year, hub split "train" (dataset card).
    "aime24": BenchmarkSpec(
        "aime24", _one(HubSource("HuggingFaceH4/aime_2024", "train", "problem", "answer", "id"), "test"), "test"
    ),
    # MathArena sets: columns problem_idx/problem/answer, hub split "train". Confirmed from the card of
    # MathArena/aime_2026; aime_2025 is listed by MathArena with 30 rows and assumed to share it.
    "aime25": BenchmarkSpec(
        "aime25", _one(HubSource("MathArena/aime_2025", "train", "problem", "answer", "problem_idx"), "test"), "test"
    ),
    "aime26": BenchmarkSpec(
        "aime26", _one(HubSource("MathArena/aime_2026", "train", "problem", "answer", "problem_idx"), "test"), "test"
    ),
    # AMC 2023-2025 (the paper's 121 problems). math-ai/amc23 (40 problems, question/answer, split
    # "test") is the standard AMC23 set. UNCONFIRMED: no standard hub id for 2024/2025 was found; the
    # two sets below are the ones public evaluation code pairs with amc23, columns as that code uses
    # them. Their total against 121 could not be checked offline; pass a local file to be sure.
    "amc23_25": BenchmarkSpec(
        "amc23_25",
        {
            "test": (
                HubSource("math-ai/amc23", "test", "question", "answer", "id", tag="amc23"),
                HubSource("rawsh/2024_AMC12", "train", "problem", "answer", tag="amc24"),
                HubSource("sonthenguyen/amc12-2025-non-figure", "train", "question", "answer", tag="amc25"),
            )
        },
        "test",
    ),
    # 500 problems, columns problem/solution/answer/subject/level/unique_id, split "test".
    "math500": BenchmarkSpec(
        "math500", _one(HubSource("HuggingFaceH4/MATH-500", "test", "problem", "answer", "unique_id"), "test"), "test"
    ),
    # Minerva math, 272 problems, columns question/answer, split "test" (dataset card).
    "minerva": BenchmarkSpec(
        "minerva", _one(HubSource("math-ai/minervamath", "test", "question", "answer"), "test"), "test"
    ),
    # Config "main", splits train/test, columns question/answer with the final answer after "####".
    "gsm8k": BenchmarkSpec(
        "gsm8k",
        {s: (HubSource("openai/gsm8k", s, "question", "answer", config="main"),) for s in ("train", "test")},
        default_split="test",
        answer_format="gsm8k",
    ),
}


def holdout_indices(answers: Sequence[Any], k: int, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held_out) row indices of the rows whose answers are ``answers``, ``k`` held out as the paper's
    authors did: rows with an empty answer dropped, then pandas' ``DataFrame.sample(n=k, random_state=seed)``
    of the rest, i.e. ``numpy.random.RandomState(seed).choice(len(rest), k, replace=False)`` positions in
    ``rest`` (pandas without pandas), held out in that order. ``kept`` is every other row in file order
    (the empty-answer rows among them are skipped and counted by the loader).
    """
    import numpy as np

    rest = [i for i, a in enumerate(answers) if (t := _text(a)) is not None and t.strip()]
    if not 0 < k < len(rest):
        raise DataError(f"data: cannot hold out {k} of {len(rest)} rows with an answer ({len(answers)} rows)")
    held = [rest[j] for j in np.random.RandomState(seed).choice(len(rest), size=k, replace=False).tolist()]
    out = set(held)
    return [i for i in range(len(answers)) if i not in out], held


# --------------------------------------------------------------------------------------------------
# Row normalisation


def _text(value: Any) -> str | None:
    """A cell as text: None stays None; floats that are integers lose their ``.0``."""
    if value is None:
        return None
    if isinstance(value, float):
        if value != value:  # NaN, e.g. an empty parquet / pandas cell
            return None
        if value.is_integer():
            return str(int(value))
    return value if isinstance(value, str) else str(value)


def _gsm8k_answer(text: str) -> str:
    return text.rsplit("####", 1)[1].strip().replace(",", "") if "####" in text else ""


@dataclass
class _Cols:
    problem: str
    answer: str
    id: str | None
    answer_format: str = "plain"
    max_problem_chars: int | None = MAX_PROBLEM_CHARS


def _to_examples(rows: Iterable[tuple[int, Mapping[str, Any]]], cols: _Cols, id_prefix: str,
                 skipped: Counter) -> list[Example]:
    """Convert (row_index, row) pairs, skipping and counting unusable rows."""
    out = []
    for idx, row in rows:
        problem, answer = _text(row.get(cols.problem)), _text(row.get(cols.answer))
        reason = _skip_reason(problem, answer, cols.max_problem_chars)
        if not reason and cols.answer_format == "gsm8k":
            answer = _gsm8k_answer(answer)
            reason = "" if answer else "no '####' answer"
        if reason:
            skipped[reason] += 1
            continue
        rid = _text(row.get(cols.id)) if cols.id else None
        out.append(Example(f"{id_prefix}{rid.strip() if rid and rid.strip() else idx}", problem, answer.strip()))
    return out


def _skip_reason(problem: str | None, answer: str | None, max_chars: int | None) -> str:
    if problem is None:
        return "missing problem"
    if not problem.strip():
        return "empty problem"
    if answer is None:
        return "missing answer"
    if not answer.strip():
        return "empty answer"
    if max_chars is not None and len(problem) > max_chars:
        return f"problem over {max_chars} chars"
    return ""


def _finish(name: str, examples: list[Example], skipped: Counter, limit: int | None) -> list[Example]:
    """Log the kept/skipped summary, reject an empty result, apply ``limit``."""
    if skipped:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        logger.warning("data: %s: kept %d rows, skipped %d (%s)", name, len(examples), sum(skipped.values()), why)
    else:
        logger.info("data: %s: kept %d rows", name, len(examples))
    if not examples:
        raise DataError(f"data: {name}: no usable row ({sum(skipped.values())} rows skipped)")
    if limit is not None:
        if limit < 0:
            raise DataError(f"data: limit must be >= 0, got {limit}")
        examples = examples[:limit]
    return examples


def _check_columns(name: str, available: Iterable[str], *required: str) -> None:
    have = list(dict.fromkeys(available))
    for col in required:
        if col not in have:
            listed = ", ".join(map(repr, have)) or "none"
            raise DataError(f"data: {name}: no column {col!r}; available columns: {listed}")


# --------------------------------------------------------------------------------------------------
# Local files


def _decode(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"data: {path}: cannot read ({e.strerror or e})") from e
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"data: {path}: not valid UTF-8 (byte {e.start}, line {line})") from e


def _read_rows(path: Path, split: str | None) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .json / .parquet / .csv file as dicts."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f"data: {path}: not a readable parquet file ({e})") from e
    text = _decode(path)
    if suffix == ".csv":  # the csv module reads quoted fields whole, line breaks included
        try:
            return list(csv.DictReader(io.StringIO(text, newline="")))
        except csv.Error as e:
            raise DataError(f"data: {path}: bad CSV ({e})") from e
    if suffix == ".jsonl":  # records end at "\n" only: str.splitlines() would also split at U+2028, U+0085, ...
        return [_json_row(path, line, n) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"data: {path}: bad JSON (line {e.lineno}: {e.msg})") from e
    return _json_records(path, data, split)


def _json_row(path: Path, line: str, n: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"data: {path}: bad JSON on line {n} ({e.msg})") from e
    if not isinstance(row, dict):
        raise DataError(f"data: {path}: line {n} is a JSON {type(row).__name__}, expected an object")
    return row


def _json_records(path: Path, data: Any, split: str | None) -> list[dict[str, Any]]:
    """A JSON file holds a list of objects, or an object with that list under ``split`` or "data"."""
    if isinstance(data, dict):
        key = split if split in data else "data" if "data" in data else None
        if key is None:
            want = split or "data"
            raise DataError(f"data: {path}: a JSON object needs a list under {want!r}; keys: {list(data)[:10]}")
        data = data[key]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"data: {path}: expected a JSON list of objects")
    return data


def _load_file(path: Path, split: str | None, cols: _Cols, limit: int | None) -> list[Example]:
    if not path.is_file():
        raise DataError(f"data: {path}: no such file")
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise DataError(f"data: {path}: unsupported file type; use one of {', '.join(FILE_SUFFIXES)}")
    rows = _read_rows(path, split)
    if not rows:
        raise DataError(f"data: {path}: no usable row (the file has no rows)")
    _check_columns(str(path), (k for r in rows for k in r), cols.problem, cols.answer)
    skipped: Counter = Counter()
    examples = _to_examples(enumerate(rows), cols, "", skipped)
    return _finish(path.name, examples, skipped, limit)


# --------------------------------------------------------------------------------------------------
# Hub benchmarks and the world


def _hub_rows(bench: str, src: HubSource) -> Any:
    import datasets as hf_datasets

    try:
        return hf_datasets.load_dataset(src.path, src.config, split=src.split)
    except Exception as e:  # noqa: BLE001 - offline, missing, gated, ...: one clear message
        raise DataError(
            f"data: {bench}: cannot load hub dataset {src.path!r} (split {src.split!r}): "
            f"{type(e).__name__}: {e}. Offline? Pass a local .jsonl/.json/.parquet/.csv path instead."
        ) from e


def _load_benchmark(
    spec: BenchmarkSpec, split: str | None, max_chars: int | None, limit: int | None
) -> list[Example]:
    split = split or spec.default_split
    if split not in spec.splits:
        raise DataError(f"data: {spec.name}: no split {split!r}; valid: {', '.join(spec.splits)}")
    examples, skipped = [], Counter()
    for src in spec.splits[split]:
        ds = _hub_rows(spec.name, src)
        _check_columns(f"{spec.name} ({src.path})", ds.column_names, src.problem_key, src.answer_key)
        id_key = src.id_key if src.id_key in ds.column_names else None
        cols = _Cols(src.problem_key, src.answer_key, id_key, spec.answer_format, max_chars)
        rows = ds.to_list() if hasattr(ds, "to_list") else list(ds)
        indices: Iterable[int] = range(len(rows))
        if spec.holdout and split in (spec.holdout_split, spec.holdout_of):
            kept, held = holdout_indices([r.get(src.answer_key) for r in rows], spec.holdout, spec.holdout_seed)
            indices = held if split == spec.holdout_split else kept
        prefix = f"{spec.name}/{src.tag + '-' if src.tag else ''}"
        examples += _to_examples(((i, rows[i]) for i in indices), cols, prefix, skipped)
    return _finish(f"{spec.name}[{split}]", examples, skipped, limit)


_SOURCES: dict[str, Callable[[str], Sequence[Example]]] = {}
# The built-in worlds' splits, ``"module:function"`` of a ``load_split(split)``, imported on first use
# (those modules import this one, so it names them rather than importing them).
BUILTIN_SOURCES = {"world": "tandem_rlvr.world.problems:load_split",
                   "shorthand": "tandem_rlvr.world.shorthand:load_split"}


def register_source(name: str, load_split: Callable[[str], Sequence[Example]]) -> None:
    """Make ``load_examples("<name>/<split>")`` return ``load_split(split)`` (also over a built-in name of
    :data:`BUILTIN_SOURCES`; those need no registration)."""
    _SOURCES[name] = load_split


def _source(name: str) -> Callable[[str], Sequence[Example]] | None:
    """The registered source ``name``, else the built-in one (imported now), else None."""
    if name in _SOURCES:
        return _SOURCES[name]
    if name not in BUILTIN_SOURCES:
        return None
    module, _, attr = BUILTIN_SOURCES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def _load_registered(name: str, split_name: str, limit: int | None) -> list[Example]:
    if not split_name:
        raise DataError(f"data: '{name}/<split>' needs a split name, e.g. '{name}/train'")
    load_split = _source(name)
    if load_split is None:
        known = sorted({*_SOURCES, *BUILTIN_SOURCES})
        raise DataError(f"data: {name}/{split_name}: no data source {name!r} is registered "
                        f"(registered: {', '.join(known) or 'none'})")
    examples = list(load_split(split_name))
    return examples if limit is None else examples[:limit]


def load_examples(
    source: str,
    split: str | None = None,
    *,
    problem_key: str = "problem",
    answer_key: str = "answer",
    id_key: str | None = "id",
    limit: int | None = None,
    max_problem_chars: int | None = MAX_PROBLEM_CHARS,
    answer_format: str = "plain",
) -> list[Example]:
    """Load math problems as :class:`Example` s from a benchmark name, a local file or the world.

    ``source``: a key of :data:`BENCHMARKS` (loaded with ``datasets.load_dataset``; ``split`` defaults
    to the benchmark's default split, ``deepscaler`` has "train" and "val"); a path to a ``.jsonl``,
    ``.json`` (a list of objects, or an object with the list under ``split`` or "data"),
    ``.parquet`` or ``.csv`` file; or ``"world/<split>"`` / ``"shorthand/<split>"`` (a built-in world's
    splits, :data:`BUILTIN_SOURCES`) or another :func:`register_source` name. ``problem_key`` / ``answer_key`` / ``id_key`` name the
    columns of a file (a missing id column gives the row index; benchmarks use their own columns).
    ``answer_format="gsm8k"`` keeps what follows ``####`` in a file's answers, commas removed.
    Skipped rows are counted in a warning; ``limit`` keeps the first rows after skipping.
    Raises :class:`DataError`.
    """
    if answer_format not in ANSWER_FORMATS:
        raise DataError(f"data: answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
    if not isinstance(source, str) or not source:
        raise DataError(f"data: source must be a benchmark name, a file path or world/<split>, got {source!r}")
    head, _, rest = source.partition("/")
    if head in _SOURCES or head in BUILTIN_SOURCES or head == "world":  # world/...: a source error, never a file
        return _load_registered(head, rest if "/" in source else (split or ""), limit)
    if source in BENCHMARKS:
        return _load_benchmark(BENCHMARKS[source], split, max_problem_chars, limit)
    path = Path(source).expanduser()
    if path.suffix.lower() in FILE_SUFFIXES or path.exists() or "/" in source or "\\" in source:
        cols = _Cols(problem_key, answer_key, id_key or None, answer_format, max_problem_chars)
        return _load_file(path, split, cols, limit)
    raise DataError(
        f"data: unknown benchmark {source!r}; valid: {', '.join(BENCHMARKS)}; "
        f"or pass a path to a {'/'.join(FILE_SUFFIXES)} file, or world/<split>"
    )


def encode_prompts(tokenizer, examples: Sequence, *, max_prompt_tokens: int | None = None,
                   what: str = "eval") -> tuple[list[int], list[list[int]]]:
    """Chat-rendered prompt ids of ``examples``; returns ``(kept example indices, ids)``.

    Prompts longer than ``max_prompt_tokens`` are skipped with a warning (``what`` names the caller)
    and counted by callers.
    """
    texts = [render_prompt(tokenizer, ex.problem) for ex in examples]
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    keep = [i for i, e in enumerate(enc) if max_prompt_tokens is None or len(e) <= max_prompt_tokens]
    if len(keep) < len(enc):
        logger.warning("%s: skipped %d of %d prompts longer than %d tokens", what, len(enc) - len(keep), len(enc),
                    max_prompt_tokens)
    return keep, [list(enc[i]) for i in keep]
