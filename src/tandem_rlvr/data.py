"""Prompts and math problem sets: named hub benchmarks, Hugging Face dataset ids and directories, local
files and the built-in world.

Every loader returns ``list[Example]`` (``id``, ``problem``, ``answer`` as strings). Rows whose
problem or answer is missing or empty, or whose problem exceeds ``max_problem_chars``, are skipped
and counted in a one-line ``logging`` warning; anything that makes a whole source unusable (missing
file, bad encoding or syntax, missing column, no usable row, unknown name, unreachable hub) raises
:class:`DataError` naming the culprit. A prompt column, template, system prompt or chat-template
arguments (:class:`~tandem_rlvr.prompts.PromptFormat`) make each problem a
:class:`~tandem_rlvr.prompts.ChatProblem`, which :func:`render_prompt` renders wherever it is called.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_rlvr.benchmarks import BENCHMARKS, BenchmarkSpec, HubSource
from tandem_rlvr.errors import DataError  # noqa: F401 (raised here; also importable from here)
from tandem_rlvr.prompts import PROMPT_SUFFIX, ChatProblem, PromptFormat, chat_messages, messages_from_cell, plain_turn

__all__ = [
    "BENCHMARKS",
    "FILE_SUFFIXES",
    "MAX_PROBLEM_CHARS",
    "PLAIN_PROMPT_TEMPLATE",
    "PROMPT_SUFFIX",
    "BenchmarkSpec",
    "ChatProblem",
    "DataError",
    "Example",
    "HubSource",
    "PromptFormat",
    "build_user_turn",
    "encode_prompt_texts",
    "holdout_indices",
    "load_examples",
    "render_prompt",
    "train_examples",
    "val_examples",
]

logger = logging.getLogger(__name__)

# Used when a tokenizer has no chat template (a base model): the user turn, then "Answer:".
PLAIN_PROMPT_TEMPLATE = "Question: {user_turn}\nAnswer:"
MAX_PROBLEM_CHARS = 100_000
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
ANSWER_FORMATS = ("plain", "gsm8k")


@dataclass(frozen=True)
class Example:
    """One math problem with its gold answer (``problem``: a ``str``, a :class:`ChatProblem` under a prompt format)."""

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
    :data:`PLAIN_PROMPT_TEMPLATE` (``"Question: <user turn>\\nAnswer:"``). A :class:`ChatProblem` renders its
    own messages with its ``chat_template_kwargs`` (without a chat template: their contents, a blank line apart)."""
    chat = isinstance(problem, ChatProblem)
    if getattr(tokenizer, "chat_template", None):
        messages = chat_messages(problem) if chat else [{"role": "user", "content": build_user_turn(problem)}]
        kwargs = dict(problem.chat_template_kwargs) if chat else {}
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    if name not in _WARNED_PLAIN:  # once per tokenizer, not once per prompt
        _WARNED_PLAIN.add(name)
        logger.warning("data: tokenizer %r has no chat template; using the plain prompt %r", name, PLAIN_PROMPT_TEMPLATE)
    return PLAIN_PROMPT_TEMPLATE.format(user_turn=plain_turn(problem) if chat else build_user_turn(problem))


_WARNED_PLAIN: set[str] = set()


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
    prompt: str | None = None  # a column of chat messages: the prompt, and its last user turn the problem
    fmt: PromptFormat = PromptFormat()


def _to_examples(rows: Iterable[tuple[int, Mapping[str, Any]]], cols: _Cols, id_prefix: str,
                 skipped: Counter) -> list[Example]:
    """Convert (row_index, row) pairs, skipping and counting unusable rows."""
    out = []
    for idx, row in rows:
        problem, why = (messages_from_cell(row.get(cols.prompt), cols.fmt) if cols.prompt
                        else (_text(row.get(cols.problem)), ""))
        answer = _text(row.get(cols.answer))
        reason = why or _skip_reason(problem, answer, cols.max_problem_chars)
        if not reason and not cols.prompt:
            problem = cols.fmt.problem(problem)
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


def _finish(name: str, examples: list[Example], skipped: Counter, limit: int | None, counts: Counter | None = None):
    """Log the kept/skipped summary (and add it to ``counts``), reject an empty result, apply ``limit``."""
    if counts is not None:
        counts.update(skipped)
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


def _load_file(path: Path, split: str | None, cols: _Cols, limit: int | None, counts: Counter | None) -> list[Example]:
    if not path.is_file():
        raise DataError(f"data: {path}: no such file")
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise DataError(f"data: {path}: unsupported file type; use one of {', '.join(FILE_SUFFIXES)}")
    return _rows_examples(str(path), path.name, _read_rows(path, split), None, cols, limit, counts)


def _rows_examples(where: str, name: str, rows: list[dict[str, Any]], columns: list[str] | None, cols: _Cols,
                   limit: int | None, counts: Counter | None = None) -> list[Example]:
    """The examples of a file's or a dataset split's rows (``columns``: the dataset's, None: the rows' keys)."""
    if not rows:
        raise DataError(f"data: {where}: no usable row (the {'file' if columns is None else 'split'} has no rows)")
    _check_columns(where, columns if columns is not None else (k for r in rows for k in r),
                   cols.prompt or cols.problem, cols.answer)
    skipped: Counter = Counter()
    examples = _to_examples(enumerate(rows), cols, "", skipped)
    return _finish(name, examples, skipped, limit, counts)


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
    spec: BenchmarkSpec, split: str | None, max_chars: int | None, limit: int | None, counts: Counter | None = None
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
    return _finish(f"{spec.name}[{split}]", examples, skipped, limit, counts)


_SOURCES: dict[str, Callable[[str], Sequence[Example]]] = {}


def register_source(name: str, load_split: Callable[[str], Sequence[Example]]) -> None:
    """Make ``load_examples("<name>/<split>")`` return ``load_split(split)`` (also over a built-in world's
    source name, :func:`builtin_sources`; those need no registration)."""
    _SOURCES[name] = load_split


def builtin_sources() -> list[str]:
    """The built-in worlds' data source names (``arith``, ``shorthand``, ``dialects``; ``world``, the arith world's old name),
    read from :mod:`tandem_rlvr.world.registry`, which imports nothing of the worlds (they import this module)."""
    from tandem_rlvr.world.registry import source_names

    return source_names()


def _source(name: str) -> Callable[[str], Sequence[Example]] | None:
    """The registered source ``name``, else the built-in world's whose source it is (imported now), else None."""
    if name in _SOURCES:
        return _SOURCES[name]
    from tandem_rlvr.world.registry import find_source

    world = find_source(name)
    return None if world is None else world.split_loader()


def _load_registered(name: str, split_name: str, limit: int | None) -> list[Example]:
    if not split_name:
        raise DataError(f"data: '{name}/<split>' needs a split name, e.g. '{name}/train'")
    load_split = _source(name)
    if load_split is None:
        known = sorted({*_SOURCES, *builtin_sources()})
        raise DataError(f"data: {name}/{split_name}: no data source {name!r} is registered "
                        f"(registered: {', '.join(known) or 'none'})")
    try:
        examples = list(load_split(split_name))
    except DataError:
        raise
    except ValueError as e:  # a world's loader: "unknown split 'tset'; choose from [...]"
        why = e.args[0] if e.args else type(e).__name__
        raise DataError(f"data: {name}/{split_name}: {why}") from e
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
    subset: str | None = None,
    prompt_key: str | None = None,
    prompt_format: PromptFormat | None = None,
    key: str = "data",
    default_split: str | None = None,
    skipped: Counter | None = None,
) -> list[Example]:
    """Load math problems as :class:`Example` s from a benchmark name, a dataset, a local file or the world.

    ``source``: a key of :data:`BENCHMARKS` (loaded with ``datasets.load_dataset``; ``split`` defaults
    to the benchmark's default split, ``deepscaler`` has "train" and "val"); a path to a ``.jsonl``,
    ``.json`` (a list of objects, or an object with the list under ``split`` or "data"),
    ``.parquet`` or ``.csv`` file; a Hugging Face dataset id ``org/name`` (``subset`` its config name) or
    dataset directory (:mod:`tandem_rlvr.data_sources`; ``split`` None: ``default_split`` or its only
    split); or ``"arith/<split>"`` / ``"shorthand/<split>"`` (a built-in world's splits, :func:`builtin_sources`;
    ``world/<split>`` is the arith world's old name, loaded with a warning) or another :func:`register_source` name. ``problem_key`` / ``answer_key`` / ``id_key`` name the
    columns of a file or dataset (a missing id column gives the row index; benchmarks use their own columns);
    ``prompt_key`` a column of chat messages that replaces the problem column (its last user turn is the problem).
    ``prompt_format`` (template, system prompt, chat-template arguments) applies to every source.
    ``answer_format="gsm8k"`` keeps what follows ``####`` in a file's answers, commas removed.
    Skipped rows are counted in a warning (and added to ``skipped``, a Counter by reason, where given: all of
    the source's, before ``limit``); ``limit`` keeps the first rows after skipping. ``key`` names the
    config key in the errors of datasets. Raises :class:`DataError`.
    """
    if answer_format not in ANSWER_FORMATS:
        raise DataError(f"data: answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
    if not isinstance(source, str) or not source:
        raise DataError(f"data: source must be a benchmark name, a file path or arith/<split>, got {source!r}")
    fmt = prompt_format or PromptFormat()
    head, _, rest = source.partition("/")
    if head in _SOURCES or head in builtin_sources() or source in BENCHMARKS:
        if "/" in source:
            _refuse_shadowed(key, source, head)
        _refuse_columns(key, source, subset, prompt_key)
        examples = (_load_registered(head, rest if "/" in source else (split or ""), limit) if source not in BENCHMARKS
                    else _load_benchmark(BENCHMARKS[source], split, max_problem_chars, limit, skipped))
        return examples if fmt.is_default else [Example(e.id, fmt.problem(e.problem), e.answer) for e in examples]
    from tandem_rlvr.data_sources import dataset_rows, is_hub_id

    path = Path(source).expanduser()
    cols = _Cols(problem_key, answer_key, id_key or None, answer_format, max_problem_chars, prompt_key or None, fmt)
    if path.suffix.lower() not in FILE_SUFFIXES and (path.is_dir() or is_hub_id(source)):
        name, rows, columns = dataset_rows(source, split, subset, key=key, default_split=default_split)
        return _rows_examples(name, name, rows, columns, cols, limit, skipped)
    if path.suffix.lower() in FILE_SUFFIXES or path.exists() or "/" in source or "\\" in source:
        return _load_file(path, split, cols, limit, skipped)
    raise DataError(
        f"data: unknown benchmark {source!r}; valid: {', '.join(BENCHMARKS)}; or pass a Hugging Face dataset id "
        f"org/name, a dataset directory, a path to a {'/'.join(FILE_SUFFIXES)} file, or arith/<split>"
    )


def _refuse_shadowed(key: str, source: str, head: str) -> None:
    """``<source>/<split>`` that is also a local path: which one was meant is not ours to guess (loading the
    built-in split silently ignored the local files), so neither is loaded."""
    if Path(source).expanduser().exists():
        raise DataError(f"{key}: {source!r} names both the built-in data source {head!r} and a local path; write "
                        f"'./{source}' for the local one, or rename or move the local path to load the built-in split")


def _refuse_columns(key: str, source: str, subset: str | None, prompt_key: str | None) -> None:
    """A benchmark or built-in source has its own columns and configs."""
    for name, value in (("subset", subset), ("prompt_key", prompt_key)):
        if value:
            raise DataError(f"{key}: {source!r} is a built-in benchmark or source with its own columns; "
                            f"data.{name} ({value!r}) applies to files and Hugging Face datasets only")


def train_examples(cfg, limit: int | None = None) -> list[Example]:
    """The training problems of a config (``data.*``)."""
    d = cfg.data
    return load_examples(d.train, d.train_split, problem_key=d.problem_key, answer_key=d.answer_key, limit=limit,
                         subset=d.subset, prompt_key=d.prompt_key, prompt_format=prompt_format(cfg),
                         key="data.train", default_split="train")


def val_examples(cfg, limit: int | None = None) -> list[Example]:
    """The validation problems of a config (``val.data`` with ``data``'s columns and prompt format)."""
    d, v = cfg.data, cfg.val
    return load_examples(v.data, v.split, problem_key=d.problem_key, answer_key=d.answer_key, id_key="id",
                         limit=limit, subset=v.subset, prompt_key=d.prompt_key, prompt_format=prompt_format(cfg),
                         key="val.data")


def prompt_format(cfg) -> PromptFormat:
    """The :class:`PromptFormat` of a config's ``data.prompt_template``, ``system_prompt``, ``chat_template_kwargs``."""
    d = cfg.data
    return PromptFormat.of(d.prompt_template, d.system_prompt, d.chat_template_kwargs)


def encode_prompt_texts(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of rendered prompts without the tokenizer's special tokens (a chat template writes its own BOS,
    or none, into the text), but a plain-template prompt (no chat template) starts with the BOS that the
    tokenizer's default encoding puts in front (Gemma's, Llama's), as its pretraining texts did."""
    if not texts:
        return []
    enc = [list(e) for e in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    bos = getattr(tokenizer, "bos_token_id", None)
    if getattr(tokenizer, "chat_template", None) or bos is None or tokenizer("a")["input_ids"][:1] != [bos]:
        return enc
    return [e if e[:1] == [bos] else [bos] + e for e in enc]


def encode_prompts(tokenizer, examples: Sequence, *, max_prompt_tokens: int | None = None,
                   what: str = "eval") -> tuple[list[int], list[list[int]]]:
    """Chat-rendered prompt ids of ``examples``; returns ``(kept example indices, ids)``.

    Prompts longer than ``max_prompt_tokens`` are skipped with a warning (``what`` names the caller)
    and counted by callers.
    """
    texts = [render_prompt(tokenizer, ex.problem) for ex in examples]
    enc = encode_prompt_texts(tokenizer, texts)
    keep = [i for i, e in enumerate(enc) if max_prompt_tokens is None or len(e) <= max_prompt_tokens]
    if len(keep) < len(enc):
        logger.warning("%s: skipped %d of %d prompts longer than %d tokens", what, len(enc) - len(keep), len(enc),
                    max_prompt_tokens)
    return keep, [list(enc[i]) for i in keep]
