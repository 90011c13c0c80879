"""Data sources and prompt keys that used to load the wrong thing silently: a typo in a built-in split, a local
path that a built-in source shadowed, chat-template arguments YAML read as a key without a value. Each is now one
:class:`DataError` / :class:`ConfigError` line naming it (train and eval alike)."""

from __future__ import annotations

import json

import pytest

from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.data import DataError, load_examples
from tandem_rlvr.evaluation.options import load_options


def test_a_typo_in_a_built_in_split_is_a_data_error_listing_the_splits():
    with pytest.raises(DataError, match=r"arith/tset: unknown split 'tset'; choose from \['test', 'test_hard'"):
        load_examples("arith/tset", key="data.train")


def test_a_registered_sources_own_data_error_passes_unchanged():
    from tandem_rlvr.data import _SOURCES, register_source

    def load(split):
        raise DataError(f"mine: no {split}")

    register_source("mine_for_test", load)
    try:
        with pytest.raises(DataError, match="^mine: no x$"):
            load_examples("mine_for_test/x")
    finally:
        _SOURCES.pop("mine_for_test")


@pytest.mark.parametrize("local", ["arith/test", "arith/test.jsonl", "world/val"])
def test_a_local_path_a_built_in_source_would_shadow_is_refused(tmp_path, monkeypatch, local):
    """'arith/test' loaded the built-in split even when ./arith/test held the user's problems: now neither loads
    until the user says which; './arith/test' is the local one."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / local
    row = json.dumps({"id": "mine", "problem": "What is 1 plus 1?", "answer": "2"}) + "\n"
    if target.suffix:
        target.parent.mkdir(parents=True)
        target.write_text(row, encoding="utf-8")
    else:
        target.mkdir(parents=True)
        (target / "data.jsonl").write_text(row, encoding="utf-8")
    with pytest.raises(DataError, match=rf"data.train: '{local}' names both the built-in data source .* write "
                                        rf"'\./{local}' for the local one"):
        load_examples(local, key="data.train")
    assert [e.id for e in load_examples(f"./{local}")] == ["mine"]


def test_a_built_in_source_without_a_local_namesake_still_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arith").mkdir()  # only the head exists locally: 'arith/val' names no local path
    assert load_examples("arith/val", limit=2)[0].id == "arith-val-00000"


@pytest.mark.parametrize("text,words", [
    ("{enable_thinking:false}", ["'enable_thinking:false' is not an argument name", "with a space after the colon"]),
    ("{enable_thinking: null}", ["'enable_thinking' has no value"]),
    ("{a b: 1}", ["'a b' is not an argument name"]),
])
def test_chat_template_kwargs_need_argument_names_with_values(tmp_path, text, words):
    """YAML reads {enable_thinking:false} as one key with no value, which apply_chat_template ignored: the
    template then rendered with thinking on. The eval flag and the training key are checked alike."""
    with pytest.raises(ConfigError) as e:
        load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"], "chat_template_kwargs": text})
    assert "(--chat-template-kwargs)" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ConfigError, match="data.chat_template_kwargs") as e:
        load_config("paper/trlvr", [f"data.chat_template_kwargs={text}"])
    assert all(w in str(e.value) for w in words), str(e.value)
    ok = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"],
                             "chat_template_kwargs": "{enable_thinking: false}"})
    assert ok.chat_template_kwargs == {"enable_thinking": False}
