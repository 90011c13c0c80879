"""Every config setting and command-line flag that an error message (or an engine's refusal) suggests works as
written: the messages are read from the source, each ``section.key=value`` loads, each ``--flag`` exists."""

import ast
import re

import yaml

from helpers.paths import ROOT
from tandem_rlvr.cli import build_parser
from tandem_rlvr.config import load_config

BASE = ["model.senior=s", "model.junior=j"]

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
