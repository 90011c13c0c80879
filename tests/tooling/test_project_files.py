"""The repository's own files: every Makefile target runs files that exist, the test command is quiet unless
its setup fails, and pyproject's packaging metadata (the SPDX license string, the tracker extras)."""

import os
import re
import shlex
import subprocess
import tomllib

from helpers.paths import ROOT


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


def test_license_is_an_spdx_string():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    extras = meta["project"]["optional-dependencies"]
    assert {"tensorboard", "wandb", "trackio"} <= extras.keys()
    assert any(d.startswith("tensorboard") for d in extras["test"])


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
