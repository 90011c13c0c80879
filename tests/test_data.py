"""Prompt rendering, local-file loading (all formats, bad rows, bad files) and benchmark specs (mocked hub)."""

from __future__ import annotations

import copy
import json
import logging
import types

import pytest

from helpers.run_files import write_jsonl as _jsonl
from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from tandem_rlvr import data as D
from tandem_rlvr.data import (
    BENCHMARKS,
    PLAIN_PROMPT_TEMPLATE,
    PROMPT_SUFFIX,
    DataError,
    Example,
    build_user_turn,
    holdout_indices,
    load_examples,
    render_prompt,
)

# ------------------------------------------------------------------------------------------------
# prompts


def test_prompt_suffix_is_the_papers():
    assert PROMPT_SUFFIX == (
        " Solve the following math problem step by step. Put your final answer inside \\boxed{}, "
        "like \\boxed{42} or \\boxed{\\frac{1}{2}}."
    )
    assert build_user_turn("What is 3 + 4?") == "What is 3 + 4?" + PROMPT_SUFFIX


def test_render_prompt_uses_the_chat_template(tokenizer):
    prompt = render_prompt(tokenizer, "What is 3 + 4?")
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": build_user_turn("What is 3 + 4?")}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == expected
    assert prompt.startswith("<|im_start|>user\nWhat is 3 + 4? Solve the following")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "system" not in prompt


def test_render_prompt_without_chat_template():
    plain = types.SimpleNamespace(chat_template=None)
    assert render_prompt(plain, "What is 2?") == "Question: What is 2?" + PROMPT_SUFFIX + "\nAnswer:"
    assert render_prompt(object(), "x").startswith("Question: x Solve")


# ------------------------------------------------------------------------------------------------
# local files

GOOD = [
    {"id": "a", "problem": "What is 1+1?", "answer": "2"},
    {"id": "b", "problem": "What is 2+2?", "answer": 4},
    {"id": "", "problem": "Half of one?", "answer": "\\frac{1}{2}"},
]
BAD = [
    {"id": "c", "problem": "No answer here", "answer": ""},
    {"id": "d", "problem": "   ", "answer": "3"},
    {"id": "e", "answer": "3"},
    {"id": "f", "problem": "x" * 200, "answer": "1"},
]


def _write(path, rows):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".csv":
        import csv

        keys = list(dict.fromkeys(k for r in rows for k in r))
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            w.writerows(rows)
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        norm = [{k: (None if r.get(k) is None else str(r[k])) for k in ("id", "problem", "answer")} for r in rows]
        pq.write_table(pa.Table.from_pylist(norm), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_file_format_keeps_good_rows_and_counts_bad_ones(tmp_path, caplog, suffix):
    path = _write(tmp_path / f"probs{suffix}", GOOD + BAD)
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        examples = load_examples(str(path), max_problem_chars=100)
    assert examples == [
        Example("a", "What is 1+1?", "2"),
        Example("b", "What is 2+2?", "4"),
        Example("2", "Half of one?", "\\frac{1}{2}"),  # empty id -> row index
    ]
    (msg,) = [r.getMessage() for r in caplog.records]
    assert msg.startswith(f"data: probs{suffix}: kept 3 rows, skipped 4 (")
    assert "empty answer: 1" in msg and "problem over 100 chars: 1" in msg
    # a CSV cell can be empty but not absent, so "missing" becomes "empty" there
    assert ("empty problem: 1, missing problem: 1" in msg) if suffix != ".csv" else ("empty problem: 2" in msg)


# the problems as written (issue 35 item 5): a file's line breaks inside a value are part of the value
MULTILINE = [{"id": "m1", "problem": "Line one,\nline two with \"quotes\"\r\nand a third.", "answer": "7"},
             {"id": "m2", "problem": "A plain one.", "answer": "8"}]


def test_a_quoted_multiline_csv_field_stays_one_row(tmp_path):
    examples = load_examples(str(_write(tmp_path / "multi.csv", MULTILINE)))
    assert [(e.id, e.problem, e.answer) for e in examples] == [(r["id"], r["problem"], r["answer"]) for r in MULTILINE]


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])  # the separators JSON allows raw in a string
def test_a_jsonl_value_holding_a_unicode_line_separator_loads(tmp_path, sep):
    """JSON allows these raw in a string; ``str.splitlines()`` breaks lines at them, a JSONL reader must not."""
    rows = [{"id": "u", "problem": f"Before{sep}after: 1+1?", "answer": "2"}, {"id": "v", "problem": "2+2?", "answer": "4"}]
    path = tmp_path / "sep.jsonl"
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows).encode("utf-8"))
    assert sep.encode("utf-8") in path.read_bytes()  # raw, not escaped
    assert [(e.id, e.problem) for e in load_examples(str(path))] == [("u", rows[0]["problem"]), ("v", "2+2?")]


def test_custom_columns_missing_id_column_and_limit(tmp_path):
    rows = [{"question": f"Q{i}?", "solution": str(i)} for i in range(5)]
    path = _write(tmp_path / "custom.jsonl", rows)
    examples = load_examples(path.as_posix(), problem_key="question", answer_key="solution", id_key="uid", limit=3)
    assert examples == [Example(str(i), f"Q{i}?", str(i)) for i in range(3)]


def test_json_object_with_data_or_split_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": GOOD}))
    assert len(load_examples(str(path))) == 3
    path.write_text(json.dumps({"test": GOOD[:1], "train": GOOD}))
    assert len(load_examples(str(path), "test")) == 1
    path.write_text(json.dumps({"rows": GOOD}))
    with pytest.raises(DataError, match="needs a list under 'data'"):
        load_examples(str(path))


def test_gsm8k_answer_format_on_a_local_file(tmp_path):
    rows = [
        {"question": "Ducks?", "answer": "16 - 3 - 4 = 9\n9 * 2 = 18\n#### 1,018"},
        {"question": "No final line", "answer": "just text"},
    ]
    path = _write(tmp_path / "gsm.jsonl", rows)
    examples = load_examples(str(path), problem_key="question", answer_format="gsm8k")
    assert examples == [Example("0", "Ducks?", "1018")]


def test_float_answers_lose_a_trailing_zero(tmp_path):
    path = _write(tmp_path / "f.json", [{"problem": "p", "answer": 3.0}, {"problem": "q", "answer": 2.5}])
    assert [e.answer for e in load_examples(str(path))] == ["3", "2.5"]


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("missing.jsonl", None, "missing.jsonl: no such file"),
        ("latin1.jsonl", b'{"problem": "caf\xe9", "answer": "1"}\n', "latin1.jsonl: not valid UTF-8 .*line 1"),
        ("broken.jsonl", b'{"problem": "p", "answer": "1"}\n{oops\n', "broken.jsonl: bad JSON on line 2"),
        ("list.jsonl", b"[1, 2]\n", "line 1 is a JSON list"),
        ("broken.json", b"[{", "broken.json: bad JSON"),
        ("scalar.json", b"42", "expected a JSON list of objects"),
        ("empty.jsonl", b"\n\n", "empty.jsonl: no usable row"),
        ("allbad.jsonl", b'{"problem": "p", "answer": ""}\n', "allbad.jsonl: no usable row"),
        ("table.txt", b"problem,answer\n", "unsupported file type"),
        ("bad.parquet", b"not parquet", "bad.parquet: not a readable parquet file"),
    ],
)
def test_bad_files_are_rejected_with_a_clear_message(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=match):
        load_examples(str(path))


def test_missing_column_names_column_file_and_available_ones(tmp_path):
    path = _write(tmp_path / "cols.csv", [{"question": "q", "final": "1"}])
    with pytest.raises(DataError) as err:
        load_examples(str(path))
    msg = str(err.value)
    assert "cols.csv" in msg and "no column 'problem'" in msg and "'question', 'final'" in msg
    with pytest.raises(DataError, match="no column 'answer'"):
        load_examples(str(path), problem_key="question")


def test_unknown_source_and_bad_arguments():
    with pytest.raises(DataError) as err:
        load_examples("math5000")
    assert "unknown benchmark 'math5000'" in str(err.value)
    assert all(name in str(err.value) for name in BENCHMARKS)
    with pytest.raises(DataError, match="answer_format"):
        load_examples("math500", answer_format="latex")
    assert issubclass(DataError, ValueError)


# ------------------------------------------------------------------------------------------------
# benchmark specs against a mocked hub


def _fake_rows(src, n=4):
    rows = []
    for i in range(n):
        answer = f"work\n#### {1000 + i:,}" if src.path == "openai/gsm8k" else f"{i}"
        row = {src.problem_key: f"{src.path} problem {i}", src.answer_key: answer, "other": "x"}
        if src.id_key:
            row[src.id_key] = f"id{i}"
        rows.append(row)
    return rows


@pytest.fixture
def fake_hub(monkeypatch):
    """Replace datasets.load_dataset by an in-memory Dataset built from each source's own columns."""
    import datasets

    sources = {(s.path, s.split): s for spec in BENCHMARKS.values() for srcs in spec.splits.values() for s in srcs}
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        n = 1200 if path == "agentica-org/DeepScaleR-Preview-Dataset" else 4
        return datasets.Dataset.from_list(_fake_rows(sources[(path, split)], n))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return calls


EXPECTED_HUB = {
    "deepscaler": ("agentica-org/DeepScaleR-Preview-Dataset", "train"),
    "aime24": ("HuggingFaceH4/aime_2024", "test"),
    "aime25": ("MathArena/aime_2025", "test"),
    "aime26": ("MathArena/aime_2026", "test"),
    "amc23_25": ("math-ai/amc23", "test"),
    "math500": ("HuggingFaceH4/MATH-500", "test"),
    "minerva": ("math-ai/minervamath", "test"),
    "gsm8k": ("openai/gsm8k", "test"),
}


def test_every_benchmark_is_specified():
    assert set(BENCHMARKS) == set(EXPECTED_HUB)
    for name, (path, default_split) in EXPECTED_HUB.items():
        spec = BENCHMARKS[name]
        assert spec.default_split == default_split and spec.splits[default_split][0].path == path


@pytest.mark.parametrize("name", [n for n in EXPECTED_HUB if n != "deepscaler"])
def test_benchmark_maps_its_columns(fake_hub, name):
    spec = BENCHMARKS[name]
    examples = load_examples(name)
    srcs = spec.splits[spec.default_split]
    assert len(examples) == 4 * len(srcs)
    first, src = examples[0], srcs[0]
    assert first.problem == f"{src.path} problem 0"
    assert first.answer == ("1000" if name == "gsm8k" else "0")  # gsm8k: after ####, commas stripped
    tag = f"{src.tag}-" if src.tag else ""
    assert first.id == f"{name}/{tag}{'id0' if src.id_key else '0'}"
    assert len({e.id for e in examples}) == len(examples)
    assert [c[0] for c in fake_hub] == [s.path for s in srcs]
    if name == "gsm8k":
        assert fake_hub[0][1] == "main"
        assert len(load_examples("gsm8k", "train", limit=2)) == 2


def test_deepscaler_train_val_split_is_deterministic_and_disjoint(fake_hub):
    val = load_examples("deepscaler", "val")
    train = load_examples("deepscaler", "train")
    assert len(val) == 1000 and len(train) == 200
    assert not {e.id for e in val} & {e.id for e in train}
    assert load_examples("deepscaler", "val") == val
    assert load_examples("deepscaler") == train


ANSWERS = ["1", "", "2", None, "3", "  ", "4", "5", float("nan"), "6", "7", "8"]  # rows 1, 3, 5, 8: no answer


def test_holdout_is_the_authors_dataframe_sample():
    """issue 36 item 8: the authors drop rows with empty answers, then ``df.sample(n=1000, random_state=0)``:
    ``RandomState(0).choice(len, k, replace=False)`` positions among the rows with an answer, in that order."""
    import numpy as np

    kept, held = holdout_indices(ANSWERS, 4, 0)
    assert held == [10, 4, 2, 11]  # by hand: rows with an answer [0, 2, 4, 6, 7, 9, 10, 11]; positions [6, 2, 1, 7]
    assert kept == [0, 1, 3, 5, 6, 7, 8, 9]  # every other row in file order (the loader skips and counts 1, 3, 5, 8)
    rest = [0, 2, 4, 6, 7, 9, 10, 11]
    assert np.random.RandomState(0).permutation(len(rest))[:4].tolist() == [6, 2, 1, 7]  # legacy choice = permutation
    big = [str(i) if i % 7 else "" for i in range(1500)]
    k_rest = [i for i, a in enumerate(big) if a]
    kept, held = holdout_indices(big, 1000, 0)
    assert held == [k_rest[j] for j in np.random.RandomState(0).permutation(len(k_rest))[:1000]]
    assert sorted(kept + held) == list(range(1500)) and not set(kept) & set(held)
    assert holdout_indices(big, 1000, 1) != (kept, held)
    with pytest.raises(DataError, match="cannot hold out 8 of 8 rows with an answer"):
        holdout_indices(ANSWERS, 8, 0)


def test_holdout_equals_pandas_sample_where_pandas_is_installed():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"answer": ANSWERS * 200})
    frame = frame[frame.answer.notna() & (frame.answer.astype(str).str.strip() != "")]
    assert holdout_indices(ANSWERS * 200, 1000, 0)[1] == frame.sample(n=1000, random_state=0).index.tolist()


def test_deepscaler_val_has_no_empty_answer_and_train_keeps_file_order(monkeypatch):
    import datasets

    rows = [{"problem": f"p{i}", "answer": "" if i % 50 == 0 else str(i)} for i in range(1300)]  # 26 empty answers
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    val, train = load_examples("deepscaler", "val"), load_examples("deepscaler", "train")
    _, held = holdout_indices([r["answer"] for r in rows], 1000, 0)
    assert [e.id for e in val] == [f"deepscaler/{i}" for i in held]
    ids = [int(e.id.split("/")[1]) for e in train]
    assert len(train) == 1300 - 26 - 1000 and ids == sorted(ids) and not set(ids) & set(held)


def test_benchmark_errors(fake_hub, monkeypatch):
    with pytest.raises(DataError, match=r"aime24: no split 'train'; valid: test"):
        load_examples("aime24", "train")
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"math500: cannot load hub dataset 'HuggingFaceH4/MATH-500'.*local"):
        load_examples("math500")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([{"q": "x"}]))
    with pytest.raises(DataError, match=r"minerva \(math-ai/minervamath\): no column 'question'; available columns: 'q'"):
        load_examples("minerva")


def test_benchmark_rows_with_bad_answers_are_counted(monkeypatch, caplog):
    import datasets

    rows = [{"problem": "p1", "answer": "1", "unique_id": "u1"}, {"problem": "p2", "answer": None, "unique_id": "u2"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        assert load_examples("math500") == [Example("math500/u1", "p1", "1")]
    assert "data: math500[test]: kept 1 rows, skipped 1 (missing answer: 1)" in caplog.text


# ------------------------------------------------------------------------------------------------
# the world hook


def test_world_source_is_a_registered_source(monkeypatch):
    from tandem_rlvr.world.problems import load_split

    assert "arith" in D.builtin_sources() and "shorthand" in D.builtin_sources()
    assert D._source("arith") is load_split, "the built-in world needs no registration"
    fake = lambda name: [Example(f"{name}-{i}", f"{i}+{i}?", str(2 * i)) for i in range(5)]  # noqa: E731
    monkeypatch.setitem(D._SOURCES, "arith", fake)
    assert load_examples("arith/train", limit=2) == [Example("train-0", "0+0?", "0"), Example("train-1", "1+1?", "2")]
    assert len(load_examples("arith", "test")) == 5


def test_world_source_without_the_world(monkeypatch):
    import tandem_rlvr.world.registry as R

    monkeypatch.setattr(R, "WORLDS", {})  # neither built in nor registered: a clear error, never another source
    monkeypatch.setitem(D._SOURCES, "other", lambda split: [])
    with pytest.raises(DataError, match="arith/train: no data source 'arith' is registered .registered: other."):
        D._load_registered("arith", "train", None)
    with pytest.raises(DataError, match="needs a split name"):
        load_examples("other/")


def test_module_constants():
    assert D.MAX_PROBLEM_CHARS == 100_000
    assert D.FILE_SUFFIXES == (".jsonl", ".json", ".parquet", ".csv")


def test_the_builtin_worlds_load_without_importing_the_world_first(tmp_path):
    """``import tandem_rlvr`` imports no subpackage; ``arith/<split>`` and ``shorthand/<split>`` are found
    by name (:func:`tandem_rlvr.data.builtin_sources`) in a process that imported only the data module."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import tandem_rlvr

    src = str(Path(tandem_rlvr.__file__).resolve().parents[1])  # this tree's package, whatever the install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    code = ("import sys; import tandem_rlvr, tandem_rlvr.data as D\n"
            "assert not [m for m in sys.modules if m.startswith('tandem_rlvr.world')], 'the root imported the world'\n"
            "w, s = D.load_examples('arith/test', limit=2), D.load_examples('shorthand/test', limit=2)\n"
            "print(w[0].id, s[0].id)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["arith-test-00000", "short-test-00000"]


# ------------------------------------------------------------------------------------------------
# bad files and rows: errors name the file, line or column; skips are counted


def test_data_missing_file_and_empty_file(tmp_path):
    with pytest.raises(DataError, match=r"data: .*missing\.jsonl: no such file"):
        load_examples(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: no usable row \(the file has no rows\)"):
        load_examples(str(empty))


def test_data_missing_column_lists_the_available_ones(tmp_path):
    f = _jsonl(tmp_path / "q.jsonl", [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(DataError, match=r"q\.jsonl: no column 'problem'; available columns: 'question', 'answer'"):
        load_examples(str(f))


def test_data_empty_answers_are_counted_skips(tmp_path, caplog):
    f = _jsonl(tmp_path / "a.jsonl", [{"problem": "1+1?", "answer": ""}, {"problem": "2+2?", "answer": "  "},
                                      {"problem": "3+3?", "answer": "6"}, {"problem": "4+4?"}])
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        ex = load_examples(str(f))
    assert [e.answer for e in ex] == ["6"]
    assert "a.jsonl: kept 1 rows, skipped 3 (empty answer: 2, missing answer: 1)" in caplog.text
    only_bad = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": ""}])
    with pytest.raises(DataError, match=r"b\.jsonl: no usable row \(1 rows skipped\)"):
        load_examples(str(only_bad))


def test_data_non_utf8_bytes_name_file_byte_and_line(tmp_path):
    f = tmp_path / "latin.jsonl"
    f.write_bytes(b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl: not valid UTF-8 \(byte 49, line 2\)"):
        load_examples(str(f))


def test_data_one_megabyte_problem_is_skipped_and_counted(tmp_path, caplog):
    f = _jsonl(tmp_path / "big.jsonl", [{"problem": "x" * 1_000_000, "answer": "1"}, {"problem": "1+1?", "answer": "2"}])
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        ex = load_examples(str(f))
    assert [e.problem for e in ex] == ["1+1?"]
    assert "skipped 1 (problem over 100000 chars: 1)" in caplog.text


def test_data_bad_json_line_is_named(tmp_path):
    f = tmp_path / "broken.jsonl"
    f.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl: bad JSON on line 2"):
        load_examples(str(f))


def test_no_chat_template_falls_back_to_plain_prompt_with_one_warning(tokenizer, monkeypatch, caplog):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    monkeypatch.setattr(D, "_WARNED_PLAIN", set())
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        a, b = render_prompt(tok, "What is 2?"), render_prompt(tok, "What is 3?")
    assert a == PLAIN_PROMPT_TEMPLATE.format(user_turn=D.build_user_turn("What is 2?"))
    assert b.startswith("Question: What is 3?") and b.endswith("\nAnswer:")
    warnings = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warnings) == 1  # once per tokenizer, not once per prompt
