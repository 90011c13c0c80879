"""Packaging: the shipped configs (one copy, in the package, usable by name), ``--version`` from pyproject's
version only, and exact pins only in constraints.txt (ranges in pyproject)."""

import fnmatch
import importlib.metadata
import re
import tomllib

import pytest
from packaging.requirements import Requirement

from helpers.paths import ROOT
from tandem_rlvr import configs
from tandem_rlvr.cli import build_parser, main
from tandem_rlvr.config import ConfigError, load_config

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


# -- the shipped configs --------------------------------------------------------------------------------
def test_every_shipped_config_is_package_data_and_there_is_one_copy():
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["tandem_rlvr.configs"]
    files = [p.relative_to(configs.ROOT).as_posix() for p in configs.ROOT.rglob("*.yaml")]
    assert len(files) >= 10
    missed = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert not missed, f"not in pyproject's package-data, so not in a wheel: {missed}"
    assert not list((ROOT / "configs").rglob("*.yaml")), "a second copy of the configs at the repository's root"


def test_a_name_loads_the_shipped_file_with_or_without_yaml():
    for name in ("trlvr", "paper/trlvr", "paper/kl_reg.yaml"):
        by_name = load_config(name, ["train.steps=3"])
        by_path = load_config(configs.ROOT / (name if name.endswith(".yaml") else f"{name}.yaml"), ["train.steps=3"])
        assert by_name == by_path
    assert load_config("paper/grpo").algo.arm == "grpo" and load_config("kl_reg").algo.arm == "kl_reg"


def test_a_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trlvr").write_text("model: {senior: world:senior, self_paired: true}\ntrain: {seed: 7}\n")
    assert load_config("trlvr").train.seed == 7
    assert load_config("grpo").train.seed == 0


def test_an_unknown_name_is_one_line_listing_the_shipped_training_configs():
    with pytest.raises(ConfigError) as e:
        load_config("paper/trlvr_typo")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config file 'paper/trlvr_typo' does not exist")
    assert "shipped: grpo, kl_reg, paper/grpo, paper/grpo_g16, paper/kl_reg, paper/trlvr, trlvr;" in msg
    assert "accelerate/ddp" not in msg and "paper/eval" not in msg  # neither trains


def test_the_eval_command_takes_the_shipped_eval_config_by_name(capsys):
    from tandem_rlvr.evaluation.options import load_options

    assert load_options("paper/eval") == load_options(str(configs.ROOT / "paper" / "eval.yaml"))
    with pytest.raises(ConfigError, match=r"eval config file 'evl' does not exist .*\(shipped: paper/eval;"):
        load_options("evl")


def test_config_show_lists_prints_and_locates_the_shipped_configs(capsys):
    assert main(["config-show"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing == [f"{k}: {' '.join(configs.names(k))}" for k in configs.KINDS]
    assert "paper/trlvr" in listing[0] and listing[2] == "accelerate: accelerate/ddp accelerate/ddp_2nodes"
    assert main(["config-show", "paper/trlvr"]) == 0
    assert capsys.readouterr().out == (configs.ROOT / "paper" / "trlvr.yaml").read_text(encoding="utf-8")
    assert main(["config-show", "--path", "accelerate/ddp"]) == 0
    assert capsys.readouterr().out == f"{configs.ROOT / 'accelerate' / 'ddp.yaml'}\n"
    assert main(["config-show", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tandem-rlvr config-show: error: no shipped config 'nope' (shipped: accelerate/ddp,") and "\n" not in err


def test_a_copied_config_trains_the_same_as_its_name(tmp_path, capsys):
    assert main(["config-show", "paper/trlvr"]) == 0
    mine = tmp_path / "my.yaml"
    mine.write_text(capsys.readouterr().out)
    assert load_config(mine) == load_config("paper/trlvr")


# -- the version ----------------------------------------------------------------------------------------
def test_the_version_has_one_source(capsys):
    import tandem_rlvr

    assert tandem_rlvr.__version__ == importlib.metadata.version("tandem-rlvr")
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tandem-rlvr {tandem_rlvr.__version__}"
    version = PYPROJECT["project"]["version"]
    copies = [p for p in (ROOT / "src").rglob("*.py") if re.search(rf"""["']{re.escape(version)}["']""", p.read_text())]
    assert not copies, f"the version {version} written again in {copies}"


# -- pins ----------------------------------------------------------------------------------------------
def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    return [Requirement(r) for r in project["dependencies"] + sum(project["optional-dependencies"].values(), [])]


def _constraints() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: {line!r} is not an exact pin"
            out[name.strip().lower().replace("_", "-")] = ver.strip()
    return out


def test_exact_pins_only_in_constraints_and_each_within_pyprojects_range():
    reqs, pins = _requirements(), _constraints()
    exact = [str(r) for r in reqs if any(s.operator in ("==", "===") for s in r.specifier)]
    assert not exact, f"exact pins belong in constraints.txt, not pyproject: {exact}"
    for r in reqs:
        name = r.name.lower().replace("_", "-")
        if name in pins:
            assert r.specifier.contains(pins[name], prereleases=True), f"constraints.txt's {name}=={pins[name]} is outside {r}"
    for name in ("transformers", "math-verify", "antlr4-python3-runtime", "trl", "torch"):
        assert name in pins, f"constraints.txt pins no {name}"
