"""Prompts as users write them: a prompt template, a system prompt, chat-template arguments and a prompt column
of chat messages; the default unchanged; training, validation and every renderer rendering alike."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.data import (
    PROMPT_SUFFIX,
    ChatProblem,
    PromptFormat,
    build_user_turn,
    encode_prompts,
    load_examples,
    render_prompt,
    train_examples,
)

# A chat template that shows a chat_template_kwargs argument (as Qwen3's enable_thinking does).
THINK_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}"
                  "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _cfg(tmp_path, **data):
    return load_config(base={"model": {"senior": "s", "self_paired": True}, "train": {"out_dir": str(tmp_path / "run")},
                             "data": data})


@pytest.fixture
def think_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = THINK_TEMPLATE
    return tok


def test_default_keys_keep_plain_problems_and_the_papers_prompt(tmp_path, tokenizer):
    f = _rows(tmp_path / "t.jsonl", [{"problem": "What is 3 + 4?", "answer": "7"}])
    (ex,) = train_examples(_cfg(tmp_path, train=f))
    assert type(ex.problem) is str  # no ChatProblem unless a prompt key is set
    assert render_prompt(tokenizer, ex.problem) == tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?" + PROMPT_SUFFIX}], add_generation_prompt=True, tokenize=False)


def test_template_system_prompt_and_chat_template_kwargs_reach_the_chat_template(tmp_path, think_tok):
    f = _rows(tmp_path / "t.jsonl", [{"problem": "What is {x} if x=2?", "answer": "2"}])
    cfg = _cfg(tmp_path, train=f, prompt_template="Q: {problem}\nAnswer in \\boxed{}.", system_prompt="You are terse.",
               chat_template_kwargs={"enable_thinking": False})
    (ex,) = train_examples(cfg)
    assert ex.problem == "What is {x} if x=2?"  # the text itself is unchanged (ids, logs, equality)
    assert render_prompt(think_tok, ex.problem) == (
        "<system>You are terse.</system><user>Q: What is {x} if x=2?\nAnswer in \\boxed{}.</user><assistant><no-think>")
    cfg.data.chat_template_kwargs = {"enable_thinking": True}
    (ex,) = train_examples(cfg)
    assert render_prompt(think_tok, ex.problem).endswith("<assistant>")


def test_prompt_column_is_rendered_as_written_with_the_system_prompt_added(tmp_path, think_tok):
    rows = [{"msgs": [{"role": "user", "content": "What is 6*7?"}], "answer": "42"},
            {"msgs": [{"role": "system", "content": "Own system."}, {"role": "user", "content": "2+2?"}], "answer": "4"},
            {"msgs": "Plain text prompt: 1+1?", "answer": "2"},
            {"msgs": [{"role": "user"}], "answer": "1"},
            {"msgs": [], "answer": "1"},
            {"msgs": 5, "answer": "1"},
            {"answer": "1"}]
    f = _rows(tmp_path / "chat.jsonl", rows)
    ex = train_examples(_cfg(tmp_path, train=f, prompt_key="msgs", system_prompt="Sys."))
    assert [e.problem for e in ex] == ["What is 6*7?", "2+2?", "Plain text prompt: 1+1?"]
    got = [render_prompt(think_tok, e.problem) for e in ex]
    assert got == ["<system>Sys.</system><user>What is 6*7?</user><assistant>",
                   "<system>Own system.</system><user>2+2?</user><assistant>",  # the row's own system turn wins
                   "<system>Sys.</system><user>Plain text prompt: 1+1?</user><assistant>"]  # no suffix, no template


def test_prompt_column_of_a_csv_file_holds_json_messages(tmp_path):
    import csv

    f = tmp_path / "chat.csv"
    with f.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["messages", "answer"])
        w.writerow([json.dumps([{"role": "user", "content": "What is 6*7?"}]), "42"])
        w.writerow(["[0, 1] is an interval; how long is it?", "1"])  # text that is no JSON list of messages
    ex = load_examples(str(f), prompt_key="messages")
    assert [e.problem.messages for e in ex] == [({"role": "user", "content": "What is 6*7?"},),
                                                ({"role": "user", "content": "[0, 1] is an interval; how long is it?"},)]


def test_prompt_column_skips_bad_rows_and_counts_them(tmp_path, caplog):
    import logging

    rows = [{"msgs": [{"role": "user", "content": "ok?"}], "answer": "1"}, {"msgs": [{"role": "user"}], "answer": "1"},
            {"msgs": [{"role": "assistant", "content": "a"}], "answer": "1"}, {"answer": "1"}]
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.data"):
        ex = load_examples(_rows(tmp_path / "c.jsonl", rows), prompt_key="msgs")
    assert len(ex) == 1
    assert ("skipped 3 (missing prompt: 1, prompt message without a string role and content: 1, "
            "prompt without a user turn: 1)") in caplog.text


def test_prompt_column_missing_is_named(tmp_path):
    from tandem_rlvr.data import DataError

    with pytest.raises(DataError, match=r"no column 'messages'; available columns: 'problem', 'answer'"):
        load_examples(_rows(tmp_path / "c.jsonl", [{"problem": "p", "answer": "1"}]), prompt_key="messages")


def test_no_chat_template_reads_the_messages_contents(tmp_path):
    import types

    plain = types.SimpleNamespace(chat_template=None, name_or_path="plain-tok")
    p = PromptFormat.of(template="Solve: {problem}", system="Sys.").problem("1+1")
    assert render_prompt(plain, p) == "Question: Sys.\n\nSolve: 1+1\nAnswer:"
    assert render_prompt(plain, "1+1") == "Question: " + build_user_turn("1+1") + "\nAnswer:"


def test_chat_problem_pickles_as_itself():
    p = PromptFormat.of(system="S", chat_template_kwargs={"enable_thinking": False}).problem("What?")
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is ChatProblem and q == "What?"
    assert q.messages == p.messages and q.chat_template_kwargs == (("enable_thinking", False),)


def test_training_validation_and_evaluation_render_alike(tmp_path, think_tok):
    """Training (preflight's prompt fit, the trainer's prompts), in-training validation and the bridge all render
    Example.problem with render_prompt: the same ids from the same file and keys."""
    from tandem_rlvr.evaluation.validation import val_examples
    from tandem_rlvr.preflight import fit_train_prompts

    f = _rows(tmp_path / "t.jsonl", [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)])
    cfg = _cfg(tmp_path, train=f, prompt_template="Solve {problem} now.", system_prompt="S.",
               chat_template_kwargs={"enable_thinking": False, "documents_seen": []})  # a list value too
    cfg.val.data, cfg.val.limit = f, 0
    train = train_examples(cfg)
    val = val_examples(cfg)

    _, train_ids, _ = fit_train_prompts(cfg, train, think_tok, [_plan_ctx()])
    _, val_ids = encode_prompts(think_tok, val)
    assert train_ids == val_ids
    want = think_tok("<system>S.</system><user>Solve What is 0+1? now.</user><assistant><no-think>",
                     add_special_tokens=False)["input_ids"]
    assert train_ids[0] == want
    assert [render_prompt(think_tok, q) for q in [e.problem for e in train]] == [  # PromptBatch.problems -> bridge
        render_prompt(think_tok, e.problem) for e in val]


def _plan_ctx():
    """A model context with no limit (the context check is not what this test is about)."""
    from tandem_rlvr.context import ModelContext

    return ModelContext("senior", "s", None, "test")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"prompt_template": "Solve this."}, r"'data\.prompt_template' must contain \{problem\}"),
        ({"prompt_template": "{problem}", "prompt_key": "messages"}, r"'data\.prompt_template' does not apply to a prompt column"),
        ({"chat_template_kwargs": 3}, r"'data\.chat_template_kwargs' must be a mapping"),
    ],
)
def test_prompt_key_errors_name_the_key(tmp_path, data, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(tmp_path, **data)


def test_prompt_keys_from_yaml_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("model: {senior: s, self_paired: true}\ntrain: {out_dir: " + str(tmp_path / "r") + "}\n"
                 "data:\n  prompt_template: 'Problem: {problem} Put it in \\boxed{}.'\n"
                 "  chat_template_kwargs: {enable_thinking: false}\n", encoding="utf-8")
    cfg = load_config(y, ["data.system_prompt=Be careful.", "data.subset=main"])
    assert cfg.data.prompt_template == "Problem: {problem} Put it in \\boxed{}."
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    assert (cfg.data.system_prompt, cfg.data.subset) == ("Be careful.", "main")
