"""The options of ``tandem-rlvr eval`` load as the training config does (one YAML reader, one merge, one coercion,
the bounds declared beside each field), with one name per meaning; the settings the library reads are built from
them once; the prompt keys of training reach the evaluation's problems."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import pkgutil

import pytest

from tandem_rlvr.cli import build_parser
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.data import render_prompt, train_examples
from tandem_rlvr.evaluation.eval_cli import _fingerprint, _load_benchmarks, resolve_options
from tandem_rlvr.evaluation.evaluate import EvalSettings, eval_sampling
from tandem_rlvr.evaluation.options import EvalOptions, load_options

PAIR = ["--senior", "s", "--junior", "j", "--benchmark", "b"]


def _flags(*argv: str) -> EvalOptions:
    return resolve_options(build_parser().parse_args(["eval", *PAIR, *argv]))


def _file(tmp_path, text: str) -> str:
    p = tmp_path / "eval.yaml"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_a_file_and_flags_are_read_as_the_training_config_reads_its_values(tmp_path):
    """YAML 1.1's readings (1e-1 a string, 8.0 for an int, off) and comma lists become the field's type, in the
    file as in training; the flags, given as text, go through the same coercion and win."""
    path = _file(tmp_path, "senior: {a: runs/a, b: runs/b}\njunior: base=Qwen/Q\nbenchmark: math500\n"
                           "temperature: 1e-1\nn: 4.0\ncurve_ps: 1.0,0.5\ntrust-remote-code: off\nlimit: 1e1\n")
    opts = load_options(path)
    assert (opts.temperature, opts.n, opts.curve_ps, opts.trust_remote_code, opts.limit) == (0.1, 4, [1.0, 0.5], False, 10)
    assert opts.seniors == {"a": "runs/a", "b": "runs/b"} and opts.juniors == {"base": "Qwen/Q"}
    assert opts.benchmarks == ["math500"]
    cfg = load_config(None, ["model.senior=s", "model.self_paired=true", "rollout.temperature=1e-1"])
    assert cfg.rollout.temperature == opts.temperature, "one coercion for both commands"
    args = build_parser().parse_args(["eval", "--config", path, "--n", "2.0", "--senior", "x/final", "--top-k", "0"])
    opts = resolve_options(args)
    assert (opts.n, opts.top_k, opts.seniors) == (2, 0, {"final": "x/final"}), "flags win over the file"


@pytest.mark.parametrize(("text", "message"), [
    ("top_p: 1.5", "eval option 'top_p' (--top-p) must be in (0, 1], got 1.5"),
    ("curve_ps: [0.5, 2]", "eval option 'curve_ps' (--curve-ps) must be a non-empty list of numbers in [0, 1], got [0.5, 2.0]"),
    ("n: abc", "eval option 'n' (--n) must be int, got 'abc' (str)"),
    ("nn: 3", "unknown eval option 'nn' (--nn); valid keys here: "),
    ("prompt_template: Solve.", "eval option 'prompt_template' (--prompt-template) must contain {problem}"),
    ("prompt_template: '{problem}'\nprompt_key: messages",
     "eval option 'prompt_template' (--prompt-template) does not apply to a prompt column (--prompt-key='messages'"),
    ("chat_template_kwargs: 3", "eval option 'chat_template_kwargs' (--chat-template-kwargs) must be a mapping"),
    ("senior: [a, b]\nseniors: [c]", "eval option 'seniors' (--senior) is given twice"),
])
def test_a_bad_file_value_is_one_line_naming_the_option_as_its_flag_would_be(tmp_path, text, message):
    path = _file(tmp_path, "senior: s\njunior: j\nbenchmark: b\n" * ("senior" not in text) + text + "\n")
    with pytest.raises(ConfigError) as e:
        load_options(path)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_flags_take_the_training_prompt_keys_and_a_mapping_as_text():
    opts = _flags("--prompt-template", "Solve: {problem}", "--system-prompt", "Be brief.", "--subset", "main",
                  "--chat-template-kwargs", "{enable_thinking: false}")
    assert (opts.prompt_template, opts.system_prompt, opts.subset) == ("Solve: {problem}", "Be brief.", "main")
    assert opts.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match=r"^eval option 'chat_template_kwargs' \(--chat-template-kwargs\) must be a mapping"):
        _flags("--chat-template-kwargs", "enable_thinking")


def test_one_name_per_meaning_junior_is_derived_from_juniors():
    names = {f.name for f in dataclasses.fields(EvalOptions)}
    assert "junior" not in names and {"juniors", "seniors", "benchmarks", "curve", "curve_ps"} <= names
    opts = _flags("--junior", "second=other/j")
    assert opts.juniors == {"j": "j", "second": "other/j"} and opts.junior == "j", "the first junior"
    two = resolve_options(build_parser().parse_args(["eval", "--senior", "s", "--junior", "a/j", "--junior", "b/j",
                                                     "--benchmark", "b"]))
    assert two.juniors == {"j": "a/j", "j_2": "b/j"} and two.junior == "a/j"


def test_no_curve_in_a_file_or_a_flag_is_the_curve_field(tmp_path):
    assert _flags("--no-curve").curve is False and _flags().curve is True
    for text in ("curve: false", "no_curve: true", "no-curve: yes"):
        opts = load_options(_file(tmp_path, f"senior: s\njunior: j\nbenchmark: b\n{text}\n"))
        assert opts.curve is False and EvalSettings.of(opts).curve_ps == (), text
    assert EvalSettings.of(_flags("--curve-ps", "0.5,1")).curve_ps == (0.5, 1.0)


def test_the_settings_default_to_the_options_defaults_defined_once():
    """EvalSettings() (the library's default) is EvalSettings.of(EvalOptions()) (the command's): the defaults live
    in EvalOptions only; crosstok and the solo validation restate none."""
    assert EvalSettings() == EvalSettings.of(EvalOptions())
    s = EvalSettings.of(_flags("--n", "3", "--max-new-tokens", "12", "--temperature", "0", "--seed", "5",
                               "--context", "99", "--max-rounds", "7", "--score-batch", "2", "--no-progress"))
    assert (s.n, s.sampling, s.seed, s.context, s.max_rounds, s.score_batch, s.progress) == (
        3, eval_sampling(12, 0.0), 5, 99, 7, 2, False)
    assert EvalSettings().but(n=2, curve_ps=None) == EvalSettings(n=2, curve_ps=())
    with pytest.raises(TypeError):
        EvalSettings().but(n_samples=2)
    with pytest.raises(ValueError, match="n and batch_size"):
        EvalSettings(n=0)


def test_every_exported_name_of_the_evaluation_exists():
    import tandem_rlvr.evaluation as ev

    missing = []
    for info in pkgutil.iter_modules(ev.__path__):
        mod = importlib.import_module(f"tandem_rlvr.evaluation.{info.name}")
        missing += [f"{info.name}.{n}" for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
    assert not missing, missing


# -- the prompt keys of training reach the evaluation's problems ------------------------------------------------
THINK_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}"
                  "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")


@pytest.fixture
def think_tok(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = THINK_TEMPLATE
    return tok


@pytest.mark.parametrize("keys", [
    {"prompt_template": "Solve {problem} now.", "system_prompt": "S.", "chat_template_kwargs": {"enable_thinking": False}},
    {"prompt_key": "messages", "system_prompt": "S."},
])
def test_eval_renders_the_prompt_training_rendered_from_the_same_keys(tmp_path, think_tok, keys):
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1),
             "messages": [{"role": "user", "content": f"Add: {i}+1"}]} for i in range(3)]
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = load_config(base={"model": {"senior": "s", "self_paired": True}, "train": {"out_dir": str(tmp_path / "run")},
                            "data": {"train": str(f), **keys}})
    opts = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": [str(f)], **keys})
    (_, evaluated), = _load_benchmarks(opts).values()
    trained = train_examples(cfg)
    assert [render_prompt(think_tok, e.problem) for e in evaluated] == [render_prompt(think_tok, e.problem) for e in trained]
    plain = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": [str(f)]})
    (_, default), = _load_benchmarks(plain).values()
    assert render_prompt(think_tok, default[0].problem) != render_prompt(think_tok, evaluated[0].problem)


def test_a_finished_part_is_reused_only_under_the_same_prompt_keys(tmp_path):
    from tandem_rlvr.data import Example

    ex = [Example("0", "What?", "1")]
    plain = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"]})
    same = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"], "prompt_template": "",
                               "chat_template_kwargs": {}})
    other = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"], "system_prompt": "S."})
    no_curve = load_options(None, {"seniors": ["s"], "juniors": ["j"], "benchmarks": ["b"], "curve": False})
    fp = lambda o: _fingerprint(o, "s", "b", ex, "j")  # noqa: E731
    # the fingerprints these options had before the prompt keys and the curve field existed (sha256 of JSON: the
    # same on every machine), so an evaluation interrupted before the upgrade resumes after it
    assert fp(plain) == fp(same) == "dc3887f123400264e339bf4f9932acc51b0c1baaa5bcf49bc49a94505ddfe23a"
    assert fp(no_curve) == "c3ba0f89b841b75d518374b9ab64e5edc835982baef93720b8dab13764cdc7e1"
    assert fp(plain) != fp(other)


def test_a_run_senior_trained_on_other_prompts_is_warned_about(tmp_path, caplog):
    """eval of a run's final/ (or a checkpoint) whose config.yaml trained with a system prompt the evaluation does
    not render: one warning naming the key and the flag; none when the options match or for a folder of no run."""
    import logging

    import yaml

    from tandem_rlvr.evaluation.eval_cli import _warn_other_prompt
    from tandem_rlvr.evaluation.options import EvalOptions

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"system_prompt": "Be brief.", "prompt_template": ""}}))
    (tmp_path / "plain").mkdir()
    caplog.set_level(logging.WARNING)
    for folder in (run / "final", run / "checkpoints" / "step-2"):
        caplog.clear()
        _warn_other_prompt(EvalOptions(), "s", str(folder))
        assert "data.system_prompt" in caplog.text and "--system-prompt" in caplog.text
        assert "prompt_template" not in caplog.text  # empty in both: the same
    caplog.clear()
    _warn_other_prompt(EvalOptions(system_prompt="Be brief."), "s", str(run / "final"))
    _warn_other_prompt(EvalOptions(), "s", str(tmp_path / "plain"))
    _warn_other_prompt(EvalOptions(), "s", "org/model")
    assert caplog.text == ""
