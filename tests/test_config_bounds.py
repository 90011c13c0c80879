"""Every config value checked before work (issue 35 item 6): each numeric key of the training config and of
``tandem-rlvr eval`` declares its range with its field (``_f(..., ge=0)``), one generic check reads the
declarations, and a value outside them stops ``tandem-rlvr train`` / ``eval`` with exit 2 and one line naming
the key and the allowed values, before any model loads. ``train.out_dir`` must be a directory of its own,
with ``~`` expanded once, in the config."""

from __future__ import annotations

import dataclasses
import math
import os
import typing

import pytest
import yaml

from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from tandem_rlvr.cli import build_parser, main
from tandem_rlvr.config import Config, ConfigError, describe, load_config
from tandem_rlvr.evaluation.options import EvalOptions
from tandem_rlvr.config_bounds import bounds_of, field_problem, numeric_fields

SECTIONS = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}
TRAIN_KEYS = [(f"{s}.{f.name}", f, t) for s, cls in SECTIONS.items() for f, t in numeric_fields(cls)]
EVAL_KEYS = [(name, f, t) for f, t in numeric_fields(EvalOptions) for name in [f.name]]
BOGUS = "/nonexistent/tandem-senior"  # a run that got past the config would fail on it, later, naming the path


def _bad_values(f: dataclasses.Field, tp: type) -> list:
    """Values just outside the field's declared range (and inf/nan for a float)."""
    b = bounds_of(f)
    if b is None or not b.numeric:
        return []  # test_every_numeric_key_declares_its_range names it
    step = 1 if tp is int else 0.5
    out = [b.ge - step if b.ge is not None else None, b.gt if b.gt is not None else None,
           b.le + step if b.le is not None else None, b.lt if b.lt is not None else None]
    out = [tp(v) for v in out if v is not None]
    return out + ([math.inf, -math.inf, math.nan] if tp is float else [])


def _edge_values(f: dataclasses.Field, tp: type) -> list:
    """Values on the inside edge of the declared range."""
    b, tiny = bounds_of(f), (1 if tp is int else 1e-9)
    if b is None or not b.numeric:
        return []
    out = [b.ge, b.le, None if b.gt is None else b.gt + tiny, None if b.lt is None else b.lt - tiny]
    return [tp(v) for v in out if v is not None]


def _yaml(value) -> str:
    """A value as a user types it in an override (``.inf``, ``.nan``: YAML's words)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return repr(value)


def _cases(keys):
    return [pytest.param(key, v, id=f"{key}={_yaml(v)}") for key, f, t in keys for v in _bad_values(f, t)]


def test_every_numeric_key_declares_its_range():
    """A new int or float field without ge/gt/le/lt fails here, naming it."""
    undeclared = [k for k, f, _ in TRAIN_KEYS + EVAL_KEYS if bounds_of(f) is None or not bounds_of(f).numeric]
    assert not undeclared, f"numeric config fields without a declared range: {undeclared}"
    assert len(TRAIN_KEYS) >= 40 and len(EVAL_KEYS) >= 15  # the enumeration sees the fields


class _StandInRun:
    """What ``tandem-rlvr train`` builds (``make_trainer``), recording the config a run would start with."""

    def __init__(self, cfg, seen):
        self.cfg, self.seen = cfg, seen
        self.engine = type("Engine", (), {"close": lambda self: None})()

    def train(self):
        self.seen.append(self.cfg)
        return "final"


def _stand_in_trainer(monkeypatch, seen: list) -> None:
    import tandem_rlvr.training.trainer as trainer

    monkeypatch.setattr(trainer, "make_trainer", lambda cfg, restart=False: _StandInRun(cfg, seen))


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """A config whose models do not exist, and a stand-in trainer that fails the test if a run starts."""
    started = []
    _stand_in_trainer(monkeypatch, started)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"senior": BOGUS, "self_paired": True},
                                    "train": {"out_dir": str(tmp_path / "run")}}))
    return path, started


def _train_cli(capsys, argv):
    rc = main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return rc, err


@pytest.mark.parametrize(("key", "value"), _cases(TRAIN_KEYS))
def test_train_refuses_each_out_of_range_value_in_one_line_before_any_model(config_file, capsys, key, value):
    path, started = config_file
    rc, err = _train_cli(capsys, ["train", str(path), f"{key}={_yaml(value)}"])
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"tandem-rlvr train: error: config key '{key}' must be "), err
    assert BOGUS not in err[0] and not started  # stopped at the config: no model read, no run started
    section, name = key.split(".")
    f = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name)
    assert bounds_of(f).describe(isinstance(value, float)) in err[0]  # the allowed range, in words


@pytest.mark.parametrize(("key", "f", "tp"), [pytest.param(k, f, t, id=k) for k, f, t in TRAIN_KEYS + EVAL_KEYS])
def test_the_edges_of_each_range_are_allowed(key, f, tp):
    for v in _edge_values(f, tp):
        assert field_problem(f, tp, v) is None, (key, v)
    for v in _bad_values(f, tp):
        assert field_problem(f, tp, v) is not None, (key, v)


@pytest.mark.parametrize(("override", "message"), [
    ("algo.weight_decay=-1", "config key 'algo.weight_decay' must be a finite number >= 0, got -1.0"),
    ("train.seed=-1", "config key 'train.seed' must be in [0, 4294967295], got -1"),
    ("model.lora_r=-4", "config key 'model.lora_r' must be >= 0, got -4"),  # was: silently full fine-tuning
    ("rollout.temperature=.inf", "config key 'rollout.temperature' must be a finite number > 0, got inf "
                                 "(GRPO samples its rollouts)"),
    ("val.limit=-1", "config key 'val.limit' must be >= 0, got -1 (0 = all)"),
    ("rollout.engine=sglang", "config key 'rollout.engine' must be hf or vllm, got 'sglang'"),
    ("algo.loss_type=ppo", "config key 'algo.loss_type' must be one of grpo, dapo, token_mean, dr_grpo, got 'ppo'"),
])
def test_the_issues_values_are_refused_as_written(config_file, capsys, override, message):
    path, started = config_file
    rc, err = _train_cli(capsys, ["train", str(path), override])
    assert (rc, err, started) == (2, [f"tandem-rlvr train: error: {message}"], [])


@pytest.mark.parametrize(("name", "value"), [pytest.param(k, v, id=f"{k}={_yaml(v)}") for k, f, t in EVAL_KEYS
                                             for v in _bad_values(f, t)])
def test_eval_refuses_each_out_of_range_option_naming_it(name, value):
    with pytest.raises(ConfigError) as e:
        EvalOptions(**{name: value})
    msg = str(e.value)
    assert msg.startswith(f"eval option '{name}' (--{name.replace('_', '-')}) must be ") and "\n" not in msg


def test_eval_stops_at_a_bad_flag_before_any_model(capsys):
    rc = main(["eval", "--senior", BOGUS, "--junior", BOGUS, "--benchmark", "math500", "--top-p", "1.5"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert (rc, err) == (2, ["tandem-rlvr eval: error: eval option 'top_p' (--top-p) must be in (0, 1], got 1.5"])


def test_help_and_the_reference_show_each_range(capsys):
    assert main(["config-help"]) == 0
    text = capsys.readouterr().out
    assert describe() in text, "config-help prints the training keys, then the eval options"
    assert "algo.weight_decay (default 0.0): AdamW weight decay. [allowed: a finite number >= 0]" in text
    assert "[allowed: in [0, 4294967295]]" in text and "eval top_p (default 0.8)" in text
    parser = build_parser()
    assert parser.parse_args(["config-help"]).command == "config-help"


# -- train.out_dir: a directory of its own, ~ expanded once ---------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch):
    home, work = tmp_path / "h" / "me", tmp_path / "w" / "work"  # ".." holds the current directory only
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


@pytest.mark.parametrize(("out_dir", "why"), [
    ("", "(the current directory)"), (".", "(the current directory)"), ("./", "(the current directory)"),
    ("/", "(the filesystem root)"), ("~", "(the home directory)"), ("~/", "(the home directory)"),
    ("..", "it holds the current directory"), ("~/..", "it holds the home directory"),
    ("CWD", "(the current directory)"), ("HOME", "(the home directory)"),
])
def test_an_out_dir_that_is_not_a_run_of_its_own_is_refused(home, capsys, out_dir, why):
    out_dir = {"CWD": os.getcwd(), "HOME": str(home)}.get(out_dir, out_dir)
    with pytest.raises(ConfigError, match=r"^config key 'train\.out_dir' must name a directory of its own") as e:
        load_config(None, ["model.senior=s", "model.self_paired=true", f"train.out_dir={out_dir}"])
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_tilde_out_dir_is_expanded_once_in_the_config(home, tmp_path, monkeypatch):
    runs = []
    _stand_in_trainer(monkeypatch, runs)
    cfg = load_config(None, ["model.senior=s", "model.self_paired=true", "train.out_dir=~/runs/a"])
    assert cfg.train.out_dir == str(home / "runs" / "a")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": {"senior": "s", "self_paired": True},
                                                    "train": {"out_dir": "~/runs/b"}}))
    assert main(["train", str(tmp_path / "c.yaml")]) == 0
    assert [c.train.out_dir for c in runs] == [str(home / "runs" / "b")]  # what the run (and its preflight) gets
    assert not (tmp_path / "w" / "work" / "~").exists()
    for fine in ("runs/x", "./runs/x", str(tmp_path / "elsewhere")):
        assert load_config(None, ["model.senior=s", "model.self_paired=true", f"train.out_dir={fine}"])


# -- the new fields of issue 36 (items 7 and 8): declared and documented here, used elsewhere ---------------
def test_validation_decoding_defaults_to_the_evaluations():
    from tandem_rlvr.evaluation.options import eval_default

    cfg = Config()
    assert (cfg.val.temperature, cfg.val.top_p, cfg.val.top_k) == tuple(
        eval_default(k) for k in ("temperature", "top_p", "top_k")) == (0.7, 0.8, 20)
    assert cfg.model.gradient_checkpointing is False
    assert "model.gradient_checkpointing (default False): Recompute activations" in describe()


def test_validation_decodes_with_the_val_keys(monkeypatch, tmp_path):
    """The sampling validation hands to the solo evaluation is val.temperature / val.top_p / val.top_k."""
    from tandem_rlvr.evaluation import validation

    got = []

    def solo_eval(senior, tok, examples, settings, **kw):
        got.append(settings.sampling)
        raise StopIteration

    monkeypatch.setattr(validation, "solo_eval", solo_eval)
    monkeypatch.setattr(validation, "val_examples", lambda cfg: [])
    monkeypatch.setattr("tandem_rlvr.context.model_context", lambda *a, **k: type("C", (), {"limit": None})())

    class Senior:
        training = False

        def eval(self):
            pass

    for over, want in (([], (0.7, 0.8, 20, 3000)), (["val.temperature=0.6", "val.top_p=0.95", "val.top_k=0",
                                                     "val.max_new_tokens=50"], (0.6, 0.95, 0, 50))):
        cfg = load_config(None, ["model.senior=s", "model.self_paired=true", *over])
        with pytest.raises(StopIteration):
            validation.validate(Senior(), None, cfg, step=1, reward_fn=lambda *a: 0.0)
        s = got[-1]
        assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens) == want


def test_a_null_path_is_refused_not_read_as_a_folder_named_none(tmp_path):
    """YAML's ``out_dir: ~`` is null: not a directory called "none" (a word key with "none" still takes it)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  senior: s\n  self_paired: true\ntrain:\n  out_dir: ~\n")
    with pytest.raises(ConfigError, match=r"'train\.out_dir' must be a string, got null"):
        load_config(cfg)
    ok = load_config(None, ["model.senior=s", "model.self_paired=true", f"train.out_dir={tmp_path / 'r'}",
                            "algo.arm=grpo", "handoff.schedule=none"])
    assert ok.handoff.schedule == "none"
