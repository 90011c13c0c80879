"""Commands as a user types them: config overrides that are not YAML, and the README's eval command."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cache(world, monkeypatch):
    """The session's installed shipped world as the commands' cache (read only here)."""
    paths, _ = world
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
    return paths


# -- 5. config overrides ------------------------------------------------------------------------------------------


def test_an_override_that_is_not_yaml_is_one_clear_error(capsys):
    from tandem_rlvr.cli import main

    rc = main(["train", "trlvr", "algo.lr=[1e-5,"])  # was: a yaml ParserError traceback
    assert rc == 2
    err = capsys.readouterr().err
    assert "algo.lr" in err and "not a YAML value" in err and "Traceback" not in err


@pytest.mark.parametrize("raw", ["{problem} {x}", "Q: {problem}", "{problem}", "[{problem}]"])
def test_a_text_key_takes_its_override_as_written(raw):
    """A text key's value that YAML reads as a mapping or list, or not at all (braces, ': '), is the text itself:
    `data.prompt_template=Q: {problem}` was refused ('must be str, got dict') or a traceback."""
    from tandem_rlvr.config import parse_overrides

    over = parse_overrides([f"data.prompt_template={raw}", f"data.system_prompt=Note: {raw}",
                            "data.chat_template_kwargs={enable_thinking: false}", "train.steps=3"])
    assert over["data"]["prompt_template"] == raw and over["data"]["system_prompt"] == f"Note: {raw}"
    assert over["data"]["chat_template_kwargs"] == {"enable_thinking": False}  # not a text key: still YAML
    assert over["train"]["steps"] == 3


# -- 6. the README's commands ---------------------------------------------------------------------------------------


def _readme_command(start: str) -> list[str]:
    """The README's command line that starts with ``start`` (continuation lines joined, the comment dropped)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(start))
    text = lines[i]
    while text.rstrip().endswith("\\"):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i]
    return shlex.split(text, comments=True)


def test_the_readmes_eval_command_passes_its_checks_on_a_world_senior(cache, tmp_path, monkeypatch):
    """README, "What is in the box": `tandem-rlvr eval --senior runs/world-trlvr/final --junior world:junior
    --benchmark arith/test ...` on a world senior (which reads 512 positions; eval's default budget is 3000 tokens,
    so the command as first written failed its context check). Run as written, the senior the session's world's."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.evaluation import evaluate

    class PastTheChecks(Exception):
        pass

    def stop(*a, **k):
        raise PastTheChecks

    argv = _readme_command("tandem-rlvr eval --senior runs/world-trlvr/final")
    assert argv[:2] == ["tandem-rlvr", "eval"]
    argv = [str(cache.senior_dir) if a == "runs/world-trlvr/final" else a for a in argv[1:]]
    argv[argv.index("--out") + 1] = str(tmp_path / "eval_out")
    monkeypatch.setattr(evaluate.EvalSettings, "of", staticmethod(stop))  # the first thing after the preflight
    with pytest.raises(PastTheChecks):
        main(argv)


def test_train_overrides_may_follow_its_options():
    """`tandem-rlvr train kl_reg --restart train.steps=2` was refused ('unrecognized arguments: train.steps=2'):
    argparse takes no positional after an option. The overrides keep their order (a later one wins); another
    command's stray argument, or an unknown option, is still refused."""
    from tandem_rlvr.cli import _parse

    a = _parse(["train", "kl_reg", "algo.lr=1e-5", "--restart", "train.steps=2", "algo.lr=2e-5"])
    assert (a.config, a.overrides, a.restart) == ("kl_reg", ["algo.lr=1e-5", "train.steps=2", "algo.lr=2e-5"], True)
    for argv in (["train", "kl_reg", "--restart", "--bogus"], ["eval", "--senior", "x", "y=z"]):
        with pytest.raises(SystemExit) as e:
            _parse(argv)
        assert e.value.code == 2


def test_each_demo_setting_has_its_own_default_out(monkeypatch):
    """docs/demo.md lists the demo's settings one after another, without --out: each must land in a folder of its
    own (one --out holds one demo, and another demo's results there are refused), the default demo in demo_out."""
    from tandem_rlvr import demo
    from tandem_rlvr.cli import main

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out_dir, **kw: seen.append(out_dir))
    for argv in ([], ["--quick"], ["--junior", "self", "--seeds", "3"], ["--world", "shorthand", "--junior", "self"],
                 ["--world", "slips", "--junior", "self", "--kl-betas", "none", "--budget", "64"],
                 ["--quick", "--out", "mine"]):
        assert main(["demo", *argv]) == 0
    assert seen == ["demo_out", "demo_out-quick", "demo_out-self-seeds3", "demo_out-shorthand-self",
                    "demo_out-slips-self-b64-kl-none", "mine"]
