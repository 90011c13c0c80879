"""Data from where users keep it: a Hugging Face dataset id resolved offline from a real local ``datasets``
cache (split, subset, column mapping), saved dataset directories and folders of data files, and the
one-line errors of each (naming the config key and the id)."""

from __future__ import annotations

import json

import pytest

from helpers.hub_cache import cache_hub_dataset, use_cache
from helpers.time_guard import no_hang  # noqa: F401 (autouse)
from tandem_rlvr.config import load_config
from tandem_rlvr.data import ChatProblem, DataError, load_examples, train_examples, val_examples

EASY = {
    "train": [{"question": "What is 1+1?", "final": 2, "uid": "e1"}, {"question": "What is 2+3?", "final": 5, "uid": "e2"}],
    "test": [{"question": "What is 4+4?", "final": "8", "uid": "t1"}],
}
HARD = {"train": [{"question": "What is 12*12?", "final": "144", "uid": "h1"}]}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local datasets cache holding myorg/tiny-math (subsets easy and hard) and myorg/solo (one subset)."""
    cache = tmp_path / "hf-datasets"
    cache_hub_dataset(cache, "myorg/tiny-math", EASY, subset="easy")
    cache_hub_dataset(cache, "myorg/tiny-math", HARD, subset="hard")
    cache_hub_dataset(cache, "myorg/solo", {"train": EASY["train"]})
    use_cache(monkeypatch, cache)
    monkeypatch.chdir(tmp_path)  # no local folder named myorg/
    return cache


def _cfg(tmp_path, **data):
    return load_config(base={"model": {"senior": "s", "self_paired": True}, "train": {"out_dir": str(tmp_path / "run")},
                             "data": {"problem_key": "question", "answer_key": "final", **data}})


def test_hub_id_loads_from_the_local_cache_with_split_subset_and_columns(hub, tmp_path):
    ex = train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="easy"))
    assert [(e.problem, e.answer) for e in ex] == [("What is 1+1?", "2"), ("What is 2+3?", "5")]  # the train split
    test = train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="easy", train_split="test"))
    assert [(e.problem, e.answer) for e in test] == [("What is 4+4?", "8")]
    hard = train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="hard"))
    assert [e.answer for e in hard] == ["144"]
    solo = train_examples(_cfg(tmp_path, train="myorg/solo"))  # one subset: no data.subset needed
    assert len(solo) == 2
    ids = load_examples("myorg/tiny-math", subset="easy", problem_key="question", answer_key="final", id_key="uid",
                        default_split="train")
    assert [e.id for e in ids] == ["e1", "e2"]


def test_missing_hub_id_offline_is_one_line_naming_the_key_and_the_id(hub, tmp_path):
    with pytest.raises(DataError) as e:
        train_examples(_cfg(tmp_path, train="myorg/not-there"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("data.train: hub dataset 'myorg/not-there' is not in the local datasets cache")
    assert str(hub) in msg and "offline" in msg
    cfg = _cfg(tmp_path, train="myorg/solo")
    cfg.val.data = "myorg/not-there"
    with pytest.raises(DataError, match=r"^val\.data: hub dataset 'myorg/not-there' is not in the local"):
        val_examples(cfg)


def test_wrong_subset_or_split_names_the_key_that_picks_it(hub, tmp_path):
    with pytest.raises(DataError, match=r"^data\.train: hub dataset 'myorg/tiny-math' \(subset 'medium'\): no such "
                                        r"subset.*'easy', 'hard'.*set data\.subset$"):
        train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="medium"))
    with pytest.raises(DataError, match=r"^data\.train: myorg/tiny-math: no split 'val'; set data\.train_split to one "
                                        r"of train, test$"):
        train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="easy", train_split="val"))


def test_missing_column_lists_the_datasets_columns(hub, tmp_path):
    with pytest.raises(DataError, match=r"myorg/tiny-math\[train\]: no column 'problem'; available columns: "
                                        r"'question', 'final', 'uid'"):
        train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="easy", problem_key="problem"))


def test_validation_of_a_dataset_with_several_splits_needs_val_split(hub, tmp_path):
    cfg = load_config(base={"model": {"senior": "s", "self_paired": True}, "train": {"out_dir": str(tmp_path / "run")},
                            "data": {"problem_key": "question", "answer_key": "final"},
                            "val": {"data": "myorg/tiny-math", "subset": "easy"}})
    with pytest.raises(DataError, match=r"^val\.data: myorg/tiny-math: has several splits \(train, test\); set val\.split"):
        val_examples(cfg)
    cfg.val.split = "test"
    assert [e.answer for e in val_examples(cfg)] == ["8"]


def test_saved_dataset_directories_and_data_folders(tmp_path):
    import datasets

    rows = EASY["train"]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(EASY["test"])}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cols = dict(problem_key="question", answer_key="final")
    assert [e.answer for e in load_examples(str(tmp_path / "one"), **cols)] == ["2", "5"]
    assert [e.answer for e in load_examples(str(tmp_path / "dict"), "test", **cols)] == ["8"]
    assert [e.answer for e in load_examples(str(tmp_path / "dict"), default_split="train", **cols)] == ["2", "5"]
    assert [e.answer for e in load_examples(str(tmp_path / "folder"), **cols)] == ["2", "5"]
    with pytest.raises(DataError, match=r"^data\.train: .*one is one saved split .*unset data\.train_split$"):
        load_examples(str(tmp_path / "one"), "train", key="data.train", **cols)
    with pytest.raises(DataError, match=r"^data\.train: .*one is a saved dataset .*unset data\.subset$"):
        load_examples(str(tmp_path / "one"), subset="easy", key="data.train", **cols)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"^data\.train: .*empty: not a dataset directory that datasets can read"):
        load_examples(str(tmp_path / "empty"), key="data.train", **cols)


def test_paths_that_are_no_hub_ids_stay_file_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for source in ("data/train.jsonl", "./myorg/x", "a/b/c"):
        with pytest.raises(DataError, match="no such file"):
            load_examples(source)


def test_builtin_benchmarks_refuse_subset_and_prompt_column(tmp_path):
    with pytest.raises(DataError, match=r"^data\.train: 'world/train' is a built-in .*data\.subset \('x'\) applies"):
        load_examples("world/train", subset="x", key="data.train")
    with pytest.raises(DataError, match=r"^data\.train: 'gsm8k' is a built-in .*data\.prompt_key \('messages'\)"):
        load_examples("gsm8k", prompt_key="messages", key="data.train")


def test_hub_prompt_column_of_chat_messages(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6*7?"}],
             "final": "42"},
            {"messages": [{"role": "assistant", "content": "no user turn"}], "final": "1"},
            {"messages": [{"role": "user", "content": "What is 9-1?"}], "final": "8"}]
    cache_hub_dataset(cache, "myorg/chat-math", {"train": rows})
    use_cache(monkeypatch, cache)
    monkeypatch.chdir(tmp_path)
    ex = train_examples(_cfg(tmp_path, train="myorg/chat-math", prompt_key="messages"))
    assert [e.problem for e in ex] == ["What is 6*7?", "What is 9-1?"]  # the row without a user turn: skipped
    assert all(isinstance(e.problem, ChatProblem) for e in ex)
    assert ex[0].problem.messages == ({"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is 6*7?"})
    assert ex[1].problem.messages == ({"role": "user", "content": "What is 9-1?"},)


def test_a_hub_dataset_is_loaded_once_per_process_and_its_notice_printed_once(hub, tmp_path, monkeypatch):
    """The checks before the first forward and the run read the same hub dataset: datasets loads it once (per
    id, subset and cache folder), and its offline notice is printed once, by datasets' own handler, not a
    second time through the root logger's."""
    import logging

    import datasets

    from tandem_rlvr import data_sources
    from tandem_rlvr.logs import quiet_libraries, setup_logging

    monkeypatch.setattr(data_sources, "_OPENED", {})
    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    lib = logging.getLogger("datasets")
    monkeypatch.setattr(lib, "propagate", lib.propagate)  # restored after the test
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    setup_logging()
    quiet_libraries()
    seen = []
    rec = logging.Handler()
    rec.emit = seen.append
    root.addHandler(rec)
    for split in ("train", "test", "train"):
        train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="easy", train_split=split))
    assert calls == [("myorg/tiny-math", "easy")]
    train_examples(_cfg(tmp_path, train="myorg/tiny-math", subset="hard"))
    assert len(calls) == 2
    assert lib.handlers, "datasets prints its notices with its own handler"
    assert not [r for r in seen if r.name.startswith("datasets")], "datasets' lines reached the root logger too"
    assert [r for r in seen if r.name.startswith("tandem_rlvr")]  # ours still do
