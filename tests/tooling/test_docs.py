"""The documentation runs as written: every command in README.md and docs/*.md names a subcommand, flags,
scripts and make targets that exist (the CLI's own parser is asked, nothing is shelled out for that), the
cheap commands run and exit 0, every relative link points at an existing file and heading, and the
generated configuration reference equals what ``tandem-rlvr config-help`` prints."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tandem_rlvr import configs
from tandem_rlvr.cli import build_parser
from tandem_rlvr.config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, *sorted((ROOT / "benchmarks").glob("*.md"))]  # pages whose links are checked
PREFIXES = ("tandem-rlvr", "bash ", "make ", "sbatch ", "python -m tandem_rlvr", ".venv/bin/")
FENCE = re.compile(r"^\s*```")
REPO_PATH = re.compile(r"^(scripts|tests|benchmarks|docs|src|reports|examples)/[\w./-]*\w$")


# -- collecting the commands --------------------------------------------------------------------------
def code_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks, continuation lines (ending in a backslash) joined."""
    out, inside, pending = [], False, ""
    for line in text.splitlines():
        if FENCE.match(line):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        out.append(line)
    return out


def inline_spans(text: str) -> list[str]:
    """The inline code spans outside code blocks (table cells' ``\\|`` read as ``|``)."""
    prose, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            prose.append(line)
    return [s.replace("\\|", "|") for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", "\n".join(prose))]


def words(line: str) -> list[str]:
    """The words of a shell line, its trailing comment dropped."""
    return shlex.split(line, comments=True)


def is_command(line: str) -> bool:
    return line.startswith(PREFIXES) or line == "make" or " -m tandem_rlvr " in f" {line} "


@functools.cache
def commands() -> list[tuple[str, str]]:
    """``(page, command)`` for every command line in the pages' code blocks."""
    return [(p.relative_to(ROOT).as_posix(), line) for p in PAGES for line in code_lines(p.read_text(encoding="utf-8"))
            if is_command(line)]


def cli_argv(ws: list[str]) -> list[str] | None:
    """What follows ``tandem-rlvr`` / ``.venv/bin/tandem-rlvr`` / ``-m tandem_rlvr`` in ``ws``; None if absent."""
    for i, w in enumerate(ws):
        if w in ("tandem-rlvr", ".venv/bin/tandem-rlvr"):
            return ws[i + 1:]
        if w == "tandem_rlvr" and i and ws[i - 1] == "-m":
            return ws[i + 1:]
    return None


def cli_commands() -> list[tuple[str, str, list[str]]]:
    """``(page, text, argv)`` of every ``tandem-rlvr`` command: in code blocks, and inline spans that start with it."""
    out = [(page, line, argv) for page, line in commands() if (argv := cli_argv(words(line))) is not None]
    for p in PAGES:
        for span in inline_spans(p.read_text(encoding="utf-8")):
            if span.startswith("tandem-rlvr "):
                out.append((p.relative_to(ROOT).as_posix(), span, span.split()[1:]))
    return out


# -- checking them against the parser ----------------------------------------------------------------
@functools.cache
def parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return top, dict(sub.choices)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}  # noqa: SLF001


def flag_of(word: str) -> str | None:
    """The option a word names (``[--quick]`` -> ``--quick``, ``--out=DIR`` -> ``--out``), else None."""
    w = word.strip("[]")
    if re.match(r"^--?[A-Za-z]", w):
        return w.split("=", 1)[0]
    return None


def cli_problems(argv: list[str]) -> list[str]:
    """What in ``argv`` the CLI's parser does not know: the subcommand, or any flag."""
    top, subs = parsers()
    problems, i = [], 0
    while i < len(argv) and flag_of(argv[i]):
        if flag_of(argv[i]) not in options(top):
            problems.append(f"tandem-rlvr has no option {flag_of(argv[i])}")
        i += 1
    if i == len(argv):
        return problems if argv else ["no subcommand"]
    sub = argv[i].strip("[]")
    if sub not in subs:
        return [*problems, f"tandem-rlvr has no subcommand {sub!r} (it has {', '.join(subs)})"]
    known = options(subs[sub])
    problems += [f"tandem-rlvr {sub} has no option {f}" for w in argv[i + 1:] if (f := flag_of(w)) and f not in known]
    return problems


def test_the_docs_hold_commands_of_every_kind():
    lines = [line for _, line in commands()]
    readme = [line for page, line in commands() if page == "README.md"]
    assert "bash scripts/demo.sh" in [" ".join(words(x)) for x in readme], "the README's demo command"
    assert "bash scripts/test.sh" in [" ".join(words(x)) for x in readme], "the README's test command (CI runs it)"
    assert any(x.startswith("make ") for x in lines) and any(x.startswith(".venv/bin/") for x in lines)
    subs = {argv[0] for _, _, argv in cli_commands() if argv and not argv[0].startswith("-")}
    assert {"train", "eval", "demo", "config-help"} <= subs, subs


def test_every_tandem_rlvr_command_names_a_subcommand_and_flags_that_exist():
    bad = [f"{page}: {text!r}: {why}" for page, text, argv in cli_commands() for why in cli_problems(argv)]
    assert not bad, "docs name what the CLI does not have:\n" + "\n".join(bad)


def test_a_planted_flag_is_caught():
    assert cli_problems(["demo", "--quick", "--no-such-flag"]) == ["tandem-rlvr demo has no option --no-such-flag"]
    assert cli_problems(["trian", "x.yaml"])[0].startswith("tandem-rlvr has no subcommand 'trian'")
    assert cli_problems(["eval", "[--curve-ps", "P]", "--out=DIR"]) == []


def make_targets() -> set[str]:
    return {m.group(1) for line in (ROOT / "Makefile").read_text().splitlines()
            if (m := re.match(r"^([A-Za-z][\w-]*):", line))}


def test_every_script_path_and_make_target_exists():
    bad, targets = [], make_targets()
    for page, line in commands():
        ws = words(line)
        if ws[0] == "bash" and len(ws) > 1 and not (ROOT / ws[1]).is_file():
            bad.append(f"{page}: {line!r}: no file {ws[1]}")
        if ws[0] == "make":
            bad += [f"{page}: {line!r}: no make target {t!r}" for t in ws[1:] if not t.startswith("-") and t not in targets]
        if ws[0].startswith(".venv/bin/") and ws[0] not in (".venv/bin/python", ".venv/bin/tandem-rlvr", ".venv/bin/pytest"):
            bad.append(f"{page}: {line!r}: {ws[0]} is not something the setup installs")
        bad += [f"{page}: {line!r}: no file {w}" for w in ws if REPO_PATH.match(w) and not (ROOT / w).exists()]
    assert not bad, "\n".join(dict.fromkeys(bad))


def test_every_train_command_loads_its_config_and_overrides():
    checked = 0
    for page, line, argv in cli_commands():
        if argv[:1] == ["train"] and len(argv) > 1 and ((ROOT / argv[1]).is_file() or configs.path_of(argv[1])):
            overrides = [w for w in argv[2:] if "=" in w and not w.startswith("-")]
            load_config(ROOT / argv[1] if (ROOT / argv[1]).is_file() else argv[1], overrides)  # ConfigError names the key
            checked += 1
    assert checked >= 5


# -- running the cheap ones ----------------------------------------------------------------------------
def cheap_argv(line: str) -> list[str] | None:
    """The argv to run for a command that finishes in seconds without downloads, else None."""
    ws = words(line)
    argv = cli_argv(ws)
    if argv is not None:  # the command only: a redirection or pipe is the shell's
        argv = argv[:next((i for i, w in enumerate(argv) if w in (">", ">>", "|", "&&", ";")), len(argv))]
    if argv is not None and ws[0] in ("tandem-rlvr", ".venv/bin/tandem-rlvr", "python"):
        if "--help" in argv or "-h" in argv or "--version" in argv or argv[:1] in (["config-help"], ["config-show"]):
            return [sys.executable, "-m", "tandem_rlvr", *argv]
        return None
    if ws[0] == ".venv/bin/python" and len(ws) > 1 and ws[1].startswith("scripts/") and ({"--check", "--help"} & set(ws)):
        return [sys.executable, *ws[1:]]
    return None


def test_the_cheap_commands_run_and_exit_0():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    runs = {tuple(a): line for _, line in commands() if (a := cheap_argv(line))}
    assert len(runs) >= 5, runs
    failed = []
    for argv, line in runs.items():
        r = subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or not r.stdout.strip():
            failed.append(f"{line!r}: rc {r.returncode}\n{r.stderr[-2000:]}")
    assert not failed, "\n".join(failed)


# -- links -----------------------------------------------------------------------------------------------
def slugs(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks skipped; repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out, inside = set(), False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        m = None if inside else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(text: str) -> list[str]:
    prose, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            prose.append(re.sub(r"`[^`]*`", "", line))
    return re.findall(r"\]\(([^)\s]+)\)", "\n".join(prose))


def test_every_relative_link_points_at_an_existing_file_and_heading():
    bad = []
    for page in LINKED:
        for link in links(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {link}"
            if not target.exists():
                bad.append(f"{where}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in slugs(target.read_text(encoding="utf-8")):
                bad.append(f"{where}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_slugs_follow_github():
    assert slugs("# A (`b.c`) d\n## The self-paired setting (`--junior self`)\n## x\n## x\n```\n# not\n```") == {
        "a-bc-d", "the-self-paired-setting---junior-self", "x", "x-1"}


# -- the generated configuration reference ---------------------------------------------------------------
def generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", ROOT / "scripts" / "gen_config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_config_reference_is_what_config_help_generates():
    gen = generator()
    page = gen.render(gen.config_help())
    assert (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8") == page, (
        "docs/config-reference.md differs from `tandem-rlvr config-help`; regenerate it: "
        ".venv/bin/python scripts/gen_config_reference.py")
    for key in ("`algo.loss_type`", "`handoff.max_gap`", "`val.select`", "`--curve-ps`", "`--no-progress`"):
        assert key in page


def test_the_generator_refuses_a_line_it_cannot_read():
    with pytest.raises(ValueError, match="unknown shape"):
        generator().render("algo.lr (default 1e-06): AdamW learning rate.\nsomething else\n", flags={})
