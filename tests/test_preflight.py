"""Every cheap input is checked before the expensive work: ``eval`` checks every model path and its output
directory, ``train`` its validation data, reward and junior before the first forward pass or model load, and
the demo its options and output directory before it builds the world."""

from pathlib import Path

import pytest

from helpers.cli_runs import cli_lines as _cli
from helpers.run_files import write_config
from helpers.run_files import write_jsonl as _jsonl
from tandem_rlvr import preflight
from tandem_rlvr.cli import main


@pytest.fixture
def no_forward(monkeypatch):
    calls = []
    import tandem_rlvr.evaluation.evaluate as ev
    import tandem_rlvr.training.trainer as tr

    monkeypatch.setattr(ev, "evaluate_pair", lambda *a, **k: calls.append("eval") or pytest.fail("forward pass"))
    monkeypatch.setattr(tr.Trainer, "train_step", lambda *a, **k: calls.append("train") or pytest.fail("forward pass"))
    return calls


def test_eval_checks_every_senior_before_evaluating_the_first(tmp_path, model_dirs, capsys, no_forward):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    typo = tmp_path / "no_such_model"
    rc, err = _cli(capsys, ["eval", "--senior", f"a={model_dirs[0]}", "--senior", f"b={typo}", "--junior",
                            str(model_dirs[1]), "--benchmark", str(bench), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 2 and f"'{typo}' does not exist" in err[-1] and no_forward == []


def test_eval_checks_the_output_directory_first(tmp_path, model_dirs, capsys, no_forward):
    bench = _jsonl(tmp_path / "b.jsonl", [{"problem": "1+1?", "answer": "2"}])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, err = _cli(capsys, ["eval", "--senior", str(model_dirs[0]), "--junior", str(model_dirs[1]), "--benchmark",
                            str(bench), "--out", str(blocker / "o"), "--no-progress"])
    assert rc == 2 and str(blocker) in err[-1] and no_forward == []


def test_train_checks_validation_data_before_the_first_step(tmp_path, model_dirs, capsys, no_forward):
    cfg = write_config(tmp_path, model_dirs)
    missing = tmp_path / "val_missing.jsonl"
    rc, err = _cli(capsys, ["train", str(cfg), f"val.data={missing}", "val.every=1"])
    assert rc == 2 and str(missing) in err[-1] and no_forward == []
    rc, err = _cli(capsys, ["train", str(cfg), "data.reward=no_such_module:fn"])
    assert rc == 2 and "no_such_module" in err[-1] and no_forward == []


def test_train_checks_the_junior_before_loading_the_senior(tmp_path, model_dirs, capsys, monkeypatch):
    import tandem_rlvr.models as models

    loads = []
    real = models.load_causal_lm
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    cfg = write_config(tmp_path, model_dirs)
    rc, err = _cli(capsys, ["train", str(cfg), f"model.junior={tmp_path / 'typo'}"])
    assert rc == 2 and "typo" in err[-1] and loads == []


def test_demo_checks_its_inputs_before_building_the_world(tmp_path, monkeypatch):
    import tandem_rlvr.world.build as build

    monkeypatch.setattr(build, "build_world", lambda *a, **k: pytest.fail("the world was built"))
    from tandem_rlvr.demo import run_demo
    from tandem_rlvr.errors import TandemError

    with pytest.raises(TandemError, match="--seeds"):
        run_demo(tmp_path / "d", seeds=0)
    with pytest.raises(TandemError, match="workers"):
        run_demo(tmp_path / "d", workers=0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TandemError, match="not a writable directory"):
        run_demo(blocker / "d")
    assert preflight.check_writable(tmp_path / "new" / "dir", "x") is None and (tmp_path / "new" / "dir").is_dir()


def test_train_reads_its_data_once_and_tokenizes_each_prompt_once(tmp_path, model_dirs, monkeypatch, caplog):
    """Preflight reads and tokenizes the data; the builder uses its :class:`~tandem_rlvr.preflight.RunPlan`
    instead of doing it again: one file read per split, one tokenization per training prompt, one log line."""
    import logging
    from collections import Counter

    import tandem_rlvr.data as data

    loads, rendered, encoded = [], Counter(), Counter()
    load, render, encode = data.load_examples, data.render_prompt, data.encode_prompts
    monkeypatch.setattr(data, "load_examples", lambda source, *a, **k: loads.append(Path(source).name) or load(source, *a, **k))
    monkeypatch.setattr(data, "render_prompt", lambda tok, problem: rendered.update([problem]) or render(tok, problem))
    monkeypatch.setattr(data, "encode_prompts", lambda tok, ex, **k: encoded.update(e.problem for e in ex) or encode(tok, ex, **k))
    val = _jsonl(tmp_path / "val.jsonl", [{"problem": f"What is {i} times 2?", "answer": str(2 * i)} for i in range(3)])
    cfg = write_config(tmp_path, model_dirs)
    train = [f"What is {i} plus 1?" for i in range(12)]  # write_config's training data
    caplog.set_level(logging.INFO, logger="tandem_rlvr")
    assert main(["train", str(cfg), "train.steps=1", "train.save_every=0", f"val.data={val}", "val.every=1",
                 "val.n=1", "val.max_new_tokens=4"]) == 0
    assert sorted(loads) == ["train.jsonl", "val.jsonl"]
    assert {p: rendered[p] for p in train} == dict.fromkeys(train, 1)
    assert {p: encoded[p] for p in train} == dict.fromkeys(train, 1)
    kept = [r.getMessage() for r in caplog.records if ": kept " in r.getMessage()]
    assert kept == ["data: train.jsonl: kept 12 rows", "data: val.jsonl: kept 3 rows"], kept


def test_the_run_plan_counts_what_it_skips_and_the_builder_takes_it_as_given(tmp_path, model_dirs, monkeypatch):
    """``check_train`` returns the kept prompts with the skipped ones counted; ``build_run(cfg, plan=...)``
    neither checks nor reads nor tokenizes again."""
    import tandem_rlvr.data as data
    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import load_tokenizer
    from tandem_rlvr.training.trainer import make_trainer

    rows = [{"problem": f"What is {i} plus 1?", "answer": str(i + 1)} for i in range(5)]
    rows.insert(2, {"problem": "What is " + " plus ".join(["1"] * 40) + "?", "answer": "40"})
    _jsonl(tmp_path / "d.jsonl", rows)
    short = max(len(ids) for ids in data.encode_prompts(load_tokenizer(str(model_dirs[0])), [
        data.Example("", r["problem"], r["answer"]) for r in rows if len(r["problem"]) < 30])[1])
    cfg = load_config(write_config(tmp_path, model_dirs, data={"train": str(tmp_path / "d.jsonl")}),
                      [f"rollout.max_prompt_tokens={short}"])
    plan = preflight.check_train(cfg)
    assert plan.fitted and len(plan.examples) == 6 and plan.prompt_example == [0, 1, 3, 4, 5]
    assert plan.too_long == 1 and plan.context.skipped == 0 and plan.val_examples is None
    assert all(len(ids) <= short for ids in plan.prompts)
    for name in ("check_train", "check_train_context", "fit_pair_prompts"):
        monkeypatch.setattr(preflight, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} again"))
    monkeypatch.setattr(data, "load_examples", lambda *a, **k: pytest.fail("data read again"))
    monkeypatch.setattr(data, "render_prompt", lambda *a, **k: pytest.fail("prompts tokenized again"))
    tr = make_trainer(cfg, plan=plan)
    tr.lock.release()
    assert tr.prompts is plan.prompts and tr.prompt_example is plan.prompt_example and tr.examples is plan.examples


def test_a_junior_of_the_seniors_vocabulary_is_measured_on_the_seniors_prompts(tmp_path, model_dirs, tokenizer, capsys,
                                                                               no_forward):
    """The pair samples the senior's prompt ids (its chat template) and the junior reads them: a junior without a
    template, whose own plain prompts are shorter, was measured on those, passed, and then read past its positions
    (a review: an IndexError from GPT-2 after sampling, a silent overrun from a RoPE model)."""
    import copy
    import json

    from types import SimpleNamespace

    from helpers.tiny_models import make_tiny_model
    from tandem_rlvr.data import encode_prompts

    from transformers import AutoTokenizer

    problems = [f"What is {i} plus 3?" for i in range(2)]
    short = tmp_path / "short"
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    plain.save_pretrained(str(short))
    examples = [SimpleNamespace(id=str(i), problem=p, answer="4") for i, p in enumerate(problems)]
    own = max(len(ids) for ids in encode_prompts(AutoTokenizer.from_pretrained(str(short)), examples)[1])
    chat = max(len(ids) for ids in encode_prompts(AutoTokenizer.from_pretrained(str(model_dirs[0])), examples)[1])
    assert chat > own, "the fixture's chat template must make the senior's prompts longer"
    new = 8
    m = make_tiny_model(len(tokenizer), 2, 32)
    m.config.max_position_embeddings = own + new  # reads its own prompts' chains, not the senior's
    m.save_pretrained(str(short))
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps({"problem": p, "answer": "4"}) + "\n" for p in problems))
    rc, err = _cli(capsys, ["eval", "--senior", f"s={model_dirs[0]}", "--junior", str(short), "--benchmark", str(bench),
                            "--out", str(tmp_path / "out"), "--max-new-tokens", str(new), "--no-curve"])
    assert rc == 2 and f"chains reach {chat + new} tokens" in "\n".join(err) and not no_forward, err
