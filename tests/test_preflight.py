"""Defects a new user met (issue 16): make targets, small configs, timings, packaging, setup noise,
YAML words, the advice in error messages, bad flag values and late failures."""

import ast
import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tandem_rlvr import preflight
from tandem_rlvr.cli import build_parser, main
from tandem_rlvr.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model.senior=s", "model.junior=j"]


# -- 1. every Makefile target runs a file that exists -----------------------------------------------
def _make_targets() -> dict[str, list[str]]:
    targets, cur = {}, None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and cur:
            targets[cur].append(line.strip())
        elif re.match(r"^[a-z][\w-]*:", line):
            cur = line.split(":")[0]
            targets[cur] = []
    return targets


def test_every_make_target_refers_to_files_that_exist():
    targets = _make_targets()
    assert {"bench", "bench-quick", "test", "demo", "setup"} <= targets.keys()
    phony = {t for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith(".PHONY:")
             for t in line.split(":", 1)[1].split()}
    assert phony == set(targets), "every target is .PHONY"
    for name, cmds in targets.items():
        for cmd in cmds:
            for word in shlex.split(cmd):
                if re.search(r"\.(py|sh)$", word):
                    assert (ROOT / word).is_file(), f"make {name}: {word} does not exist"
    assert any("TANDEM_BENCH_QUICK=1" in c for c in targets["bench-quick"])


# -- 3. a small config needs no mini-batch key --------------------------------------------------------
def test_default_mini_batch_adapts_to_a_small_step():
    cfg = load_config(None, [*BASE, "train.prompts_per_step=4"])
    assert cfg.algo.mini_batch_prompts == 0 and cfg.mini_batch_prompts() == 4
    assert load_config(None, [*BASE, "train.prompts_per_step=4", "algo.mini_batch_prompts=2"]).mini_batch_prompts() == 2
    with pytest.raises(ConfigError, match="algo.mini_batch_prompts"):
        load_config(None, [*BASE, "train.prompts_per_step=4", "algo.mini_batch_prompts=3"])
    for arm in ("trlvr", "grpo", "kl_reg"):  # the paper configs keep their explicit 8
        assert load_config(ROOT / "configs" / "paper" / f"{arm}.yaml").mini_batch_prompts() == 8


# -- 4. a wall-clock figure is only ever under time/ ------------------------------------------------
def test_reward_scorer_stats_differ_between_equal_calls_only_under_time():
    from tandem_rlvr.rewards import RewardScorer

    texts, golds = ["so \\boxed{2}", "\\boxed{3}", "no box"], ["2", "2", "2"]
    with RewardScorer("math", time_limit=5.0, num_workers=1) as sc:
        a, b = sc.score(texts, golds)[1], sc.score(texts, golds)[1]
    timings = {k for k in a if "second" in k or k.endswith("_s")}
    assert timings and all(k.startswith("time/") for k in timings), timings
    assert {k: v for k, v in a.items() if not k.startswith("time/")} == {k: v for k, v in b.items() if not k.startswith("time/")}


# -- 5. packaging: the SPDX license string ----------------------------------------------------------
def test_license_is_an_spdx_string():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    extras = meta["project"]["optional-dependencies"]
    assert {"tensorboard", "wandb", "trackio"} <= extras.keys()
    assert any(d.startswith("tensorboard") for d in extras["test"])


# -- 6. the test command is quiet unless setup fails --------------------------------------------------
FAKE_PY = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  for i in $(seq 1 60); do echo "Requirement already satisfied: pkg$i in ./.venv"; done
  [ -n "${FAIL_PIP:-}" ] && { echo "ERROR: No matching distribution found for torch" >&2; exit 1; }
  exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then echo "TESTS RAN"; exit 0; fi
if [ "$1" = "-" ]; then cat >/dev/null; echo "tandem-rlvr env: fake"; exit 0; fi
exit 0
"""


def _fake_checkout(tmp_path):
    for f in ("scripts/setup.sh", "scripts/test.sh", "constraints.txt", "pyproject.toml"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text((ROOT / f).read_text())
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(FAKE_PY)
    (bin_ / "python").chmod(0o755)
    (bin_ / "activate").write_text(f'export PATH="{bin_}:$PATH"\n')
    return tmp_path


def test_test_script_is_quiet_unless_setup_fails(tmp_path):
    repo = _fake_checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "FAIL_PIP"}
    ok = subprocess.run(["bash", "scripts/test.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "TESTS RAN" and ok.stderr == "", (ok.stdout, ok.stderr)
    bad = subprocess.run(["bash", "scripts/test.sh"], cwd=repo, env={**env, "FAIL_PIP": "1"}, capture_output=True, text=True)
    assert bad.returncode != 0 and "TESTS RAN" not in bad.stdout
    assert "setup failed" in bad.stderr and "No matching distribution found for torch" in bad.stderr
    assert "Requirement already satisfied: pkg60" in bad.stderr  # the whole pip log


# -- 8. words YAML reads as booleans, and every config suggestion in an error message works as written --
@pytest.mark.parametrize("word", ["off", "false", "no", "Off", "FALSE"])
def test_fsdp_off_in_overrides_and_files(tmp_path, word):
    assert load_config(None, [*BASE, f"train.fsdp={word}"]).train.fsdp == "off"
    f = tmp_path / "c.yaml"
    f.write_text(f"model: {{senior: s, junior: j}}\ntrain:\n  fsdp: {word}\n")
    assert load_config(f).train.fsdp == "off"


def test_word_values_and_booleans_as_typed():
    assert load_config(None, [*BASE, "handoff.schedule=none"]).handoff.schedule == "none"
    cfg = load_config(None, [*BASE, "train.progress=off", "algo.normalize_std=no", "model.trust_remote_code='yes'"])
    assert (cfg.train.progress, cfg.algo.normalize_std, cfg.model.trust_remote_code) == (False, False, True)
    assert load_config(None, [*BASE, "train.trackers=tensorboard"]).train.trackers == ["tensorboard"]
    assert load_config(None, [*BASE, "train.steps=1e3"]).train.steps == 1000
    with pytest.raises(ConfigError, match="train.fsdp.*YAML reads yes/on/true"):
        load_config(None, [*BASE, "train.fsdp=on"])
    with pytest.raises(ConfigError, match="train.fsdp"):
        load_config(None, [*BASE, "train.fsdp=maybe"])


SUGGESTION = re.compile(r"(?<![\w/.-])((?:model|algo|handoff|rollout|train|data|val)\.[a-z_]+)"
                        r"(?:(=)([\w.-]+|\[[\w,]+\])|(: )(true|false|on|off|yes|no|\d+))(?![\w{\[])")
# what else a suggestion needs to hold (its message says so): the bridge serves step-level handoffs
CONTEXT = {"model.bridge": {"handoff": {"schedule": "step"}}}


def _messages() -> list[str]:
    """String constants in raise statements (and the strings they are built from) and in the engines' refusal
    reasons (``Serves(...)``, raised when a schedule is not served) across src/."""
    out = []
    for path in (ROOT / "src" / "tandem_rlvr").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            refusal = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Serves"  # engines' refusal reasons
            if isinstance(node, (ast.Raise, ast.Tuple)) or refusal:
                out += [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def test_every_config_suggestion_in_an_error_message_works_as_written(tmp_path):
    found = set()
    for m in _messages():
        for key, eq, v1, colon, v2 in SUGGESTION.findall(m):
            found.add((key, eq or colon, (v1 or v2).rstrip(".")))
    keys = {k for k, _, _ in found}
    assert {"train.fsdp", "rollout.engine", "model.dtype", "handoff.schedule", "model.bridge"} <= keys, found
    for key, sep, value in sorted(found):
        section, name = key.split(".")
        if sep == "=":  # an override on the command line
            cfg = load_config(None, [*BASE, f"{key}={value}"], base=CONTEXT.get(key))
        else:  # "model.bridge: true": the YAML form, in a config file
            data = {"model": {"senior": "s", "junior": "j"}, **CONTEXT.get(key, {})}
            data.setdefault(section, {})
            f = tmp_path / "c.yaml"
            f.write_text(yaml.safe_dump(data) .replace(f"{section}:\n", f"{section}:\n  {name}: {value}\n", 1))
            cfg = load_config(f)
        got = getattr(getattr(cfg, section), name)
        want = yaml.safe_load(value)
        assert got == want or str(got) == str(value) or got == "off" and want is False, (key, value, got)


def test_every_flag_an_error_message_names_exists():
    flags = {f for m in _messages() for f in re.findall(r"(?<![\w-])--[a-z][a-z-]+", m)}
    parser = build_parser()
    known = {s for a in parser._actions for s in a.option_strings}
    for sub in parser._subparsers._group_actions[0].choices.values():
        known |= {s for a in sub._actions for s in a.option_strings}
    assert flags and flags <= known, flags - known


# -- 9. a bad flag value is a one-line error --------------------------------------------------------
def _cli(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


@pytest.mark.parametrize("ps", ["0.5,abc", "0.5,1.5", ""])
def test_bad_curve_ps_is_one_line(tmp_path, capsys, ps):
    rc, err = _cli(capsys, ["eval", "--senior", "s", "--junior", "j", "--benchmark", "b", "--curve-ps", ps,
                            "--out", str(tmp_path / "o")])
    assert rc == 2 and len(err) == 1 and "--curve-ps" in err[0], err


def test_bad_eval_config_value_is_one_line(tmp_path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text("senior: s\njunior: j\nbenchmark: b\nn: abc\n")
    rc, err = _cli(capsys, ["eval", "--config", str(f), "--out", str(tmp_path / "o")])
    assert rc == 2 and len(err) == 1 and "'eval n'" in err[0], err


# -- 10. every cheap input is checked before the first forward pass ---------------------------------
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


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
    from test_cli_train import write_config

    cfg = write_config(tmp_path, model_dirs)
    missing = tmp_path / "val_missing.jsonl"
    rc, err = _cli(capsys, ["train", str(cfg), f"val.data={missing}", "val.every=1"])
    assert rc == 2 and str(missing) in err[-1] and no_forward == []
    rc, err = _cli(capsys, ["train", str(cfg), "data.reward=no_such_module:fn"])
    assert rc == 2 and "no_such_module" in err[-1] and no_forward == []


def test_train_checks_the_junior_before_loading_the_senior(tmp_path, model_dirs, capsys, monkeypatch):
    from test_cli_train import write_config

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
