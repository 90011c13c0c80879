"""``tandem-rlvr eval --out``: an evaluation writes only into a new or empty folder or one of its own (a folder of
other files, another evaluation's folder or a file is refused in one line, exit code 2, before anything is written),
holds the folder's ``run.lock`` while it writes, reports the rows a benchmark lost while loading, and removes the
temporary files a killed run left beside a part it computes again (docs/evaluation.md).

Tiny random models on the fixture tokenizer (``model_dirs``), run through ``tandem_rlvr.cli.main``.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from helpers.cli_runs import cli_lines
from helpers.cli_runs import refused as _refused
from helpers.run_files import write_jsonl


def _bench(path, rows):
    return str(write_jsonl(path, rows))


@pytest.fixture
def bench(tmp_path):
    return _bench(tmp_path / "bench.jsonl", [{"id": f"p{i}", "problem": f"What is {i} plus 4?", "answer": str(i + 4)}
                                             for i in range(2)])


def _argv(model_dirs, bench, out, *extra, senior="s"):
    s_dir, j_dir = model_dirs
    return ["eval", "--senior", f"{senior}={s_dir}", "--junior", str(j_dir), "--benchmark", bench, "--out", str(out),
            "--n", "1", "--max-new-tokens", "4", "--no-curve", "--no-progress", "--reward", "boxed_exact", *extra]


def _run(capsys, argv):
    rc, err = cli_lines(capsys, argv)
    assert rc == 0, err


def _files(folder):
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


USER_FILES = {"eval.json": '{"mine": 1}\n', "eval.md": "my notes\n", "eval.csv": "x,y\n",
              "chains/s/bench.jsonl": "mine\n"}


@pytest.mark.parametrize("user,named", [
    (USER_FILES, "'chains'"),  # the first entry (sorted) of a folder no evaluation wrote
    ({"eval.json": '{"mine": 1}\n'}, "'eval.json'"),  # a user's eval.json is read, not taken for a report by its name
    ({"notes.txt": "mine\n"}, "'notes.txt'"),
])
def test_an_out_of_files_no_evaluation_wrote_is_refused_before_anything_is_written(model_dirs, bench, tmp_path, capsys,
                                                                                   no_weights, user, named):
    out = tmp_path / "out"
    for rel, text in user.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
    before = _files(out)
    for extra in ([], ["--overwrite"]):  # --overwrite recomputes an evaluation's parts; never replaces others' files
        _refused(capsys, _argv(model_dirs, bench, out, *extra), f"eval --out {str(out)!r} holds {named}",
                 "which no evaluation writes", "choose another --out")
        assert _files(out) == before  # no run.lock, no marker: nothing written
        assert sorted(p.name for p in out.iterdir()) == sorted({r.split("/")[0] for r in user})


@pytest.mark.parametrize("rel,text", [("notes.txt", "mine\n"), ("chains/s/mine.txt", "mine\n"),
                                      ("parts/sub/x.json", "{}"), ("eval.json", '{"mine": 1}\n')])
def test_a_users_file_in_an_evaluations_out_is_refused_naming_it(model_dirs, bench, tmp_path, capsys, rel, text):
    out = tmp_path / "out"
    _run(capsys, _argv(model_dirs, bench, out))
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text(text, encoding="utf-8")
    before = _files(out)
    named = rel if not rel.startswith("parts/") else "parts/sub"
    _refused(capsys, _argv(model_dirs, bench, out), f"holds {named!r}", "which no evaluation writes")
    assert _files(out) == before


def test_another_evaluation_into_the_same_out_is_refused_and_the_same_one_resumes(model_dirs, bench, tmp_path, capsys):
    """A rerun of the same evaluation reuses its finished part; another one (here another senior name, whose part
    and chains would not collide) would replace the report: refused naming what differs, unless --overwrite."""
    out = tmp_path / "out"
    _run(capsys, _argv(model_dirs, bench, out, senior="first"))
    before = _files(out)
    _refused(capsys, _argv(model_dirs, bench, out, senior="second"), "holds another evaluation",
             f"--senior first={model_dirs[0]} -> second={model_dirs[0]}", "--overwrite", "another --out")
    assert _files(out) == before
    _run(capsys, _argv(model_dirs, bench, out, senior="first"))  # the same evaluation: resumed, its part reused
    assert _files(out)["chains/first/bench.jsonl"] == before["chains/first/bench.jsonl"]
    assert json.loads((out / "eval.json").read_text(encoding="utf-8"))["senior"] == "first"
    _run(capsys, _argv(model_dirs, bench, out, "--overwrite", senior="second"))
    assert json.loads((out / "eval.json").read_text(encoding="utf-8"))["senior"] == "second"
    assert (out / "chains" / "first" / "bench.jsonl").read_bytes() == before["chains/first/bench.jsonl"]
    _refused(capsys, _argv(model_dirs, bench, out, senior="first"), "holds another evaluation")


def test_an_out_an_older_version_wrote_is_still_an_evaluations(model_dirs, bench, tmp_path, capsys):
    """A folder without the marker (an older version wrote it) is an evaluation's by its eval.json report, or by a
    finished part: resumed as before, and another evaluation into it refused by the report's settings."""
    from tandem_rlvr.evaluation.outdir import MARKER

    out = tmp_path / "out"
    _run(capsys, _argv(model_dirs, bench, out))
    (out / MARKER).unlink()
    _refused(capsys, _argv(model_dirs, bench, out, senior="other"), "holds another evaluation", "-> other=")
    _run(capsys, _argv(model_dirs, bench, out))
    assert (out / MARKER).is_file()
    for name in (MARKER, "eval.json", "eval.md"):
        (out / name).unlink()
    _run(capsys, _argv(model_dirs, bench, out))  # a finished part only


def test_an_out_that_is_a_file_is_one_line(model_dirs, bench, tmp_path, capsys, no_weights):
    out = tmp_path / "results"
    out.write_text("mine\n", encoding="utf-8")
    _refused(capsys, _argv(model_dirs, bench, out), f"eval --out {str(out)!r} is a file, not a folder")
    assert out.read_text(encoding="utf-8") == "mine\n"


_HOLD = textwrap.dedent("""
    import fcntl, json, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": "elsewhere", "started": "now"}).encode())
    print("locked", flush=True)
    sys.stdin.read()
""")


def test_an_out_another_evaluation_is_writing_is_refused_naming_it(model_dirs, bench, tmp_path, capsys, no_weights):
    """The evaluation holds --out's run.lock while it writes: a second one into the same --out is refused (before
    any weights load), naming the holder; it writes nothing there."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out / "run.lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        _refused(capsys, _argv(model_dirs, bench, out), "in use by another evaluation", "host elsewhere", "--out")
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


PARTIAL = [{"id": "a", "problem": "What is 1 plus 4?", "answer": "5"}, {"id": "b", "problem": "What is 2 plus 4?"},
           {"id": "c", "problem": "What is 3 plus 4?", "answer": None}, {"id": "d", "problem": " ", "answer": "1"},
           {"id": "e", "problem": "What is 5 plus 4?", "answer": "9"}]


def test_the_loader_counts_the_rows_it_skips_for_its_caller(tmp_path):
    from tandem_rlvr.data import load_examples

    partial = _bench(tmp_path / "partial.jsonl", PARTIAL)
    skipped = Counter()
    assert [e.id for e in load_examples(partial, skipped=skipped, limit=1)] == ["a"]
    assert skipped == {"missing answer": 2, "empty problem": 1}  # all of the file's rows, before the limit
    assert [e.id for e in load_examples(partial)] == ["a", "e"]  # without a counter: as before


def test_rows_a_benchmark_lost_while_loading_are_reported(model_dirs, tmp_path, capsys):
    """The loader drops rows without an answer or with an empty problem; eval.json (per benchmark and summed in the
    macro), eval.md and eval.csv say how many, by reason."""
    partial = _bench(tmp_path / "partial.jsonl", PARTIAL)
    clean = _bench(tmp_path / "clean.jsonl", PARTIAL[:1])
    out = tmp_path / "out"
    _run(capsys, [*_argv(model_dirs, partial, out), "--benchmark", clean])
    obj = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    lost = {"empty problem": 1, "missing answer": 2}
    assert obj["per_benchmark"]["partial"]["n_skipped_at_load"] == lost
    assert obj["per_benchmark"]["clean"]["n_skipped_at_load"] == {}
    assert obj["macro"]["n_skipped_at_load"] == lost
    md = (out / "eval.md").read_text(encoding="utf-8")
    assert "partial: 3 (empty problem: 1, missing answer: 2)" in md and "clean:" not in md
    with (out / "eval.csv").open(encoding="utf-8", newline="") as f:
        got = {(r["benchmark"], r["metric"]): r["value"] for r in csv.DictReader(f)}
    assert got[("partial", "n_skipped_at_load.missing answer")] == "2"
    assert got[("partial", "n_skipped_at_load.empty problem")] == "1"
    assert got[("macro", "n_skipped_at_load.missing answer")] == "2"


def test_a_part_computed_again_removes_the_temporaries_a_killed_run_left(model_dirs, bench, tmp_path, capsys):
    """A SIGKILL mid-write leaves ``.NAME.<random>.tmp`` beside the chains file (and the part); the run that computes
    that part again removes them. Other files, another part's temporaries among them, stay."""
    out = tmp_path / "out"
    _run(capsys, _argv(model_dirs, bench, out))
    stale = [out / "chains" / "s" / ".bench.jsonl.k3x_9q0a.tmp", out / "parts" / ".s__bench.json.ab12cd34.tmp"]
    kept = out / "chains" / "s" / ".other.jsonl.k3x_9q0a.tmp"
    for p in (*stale, kept):
        p.write_text('{"half": ', encoding="utf-8")
    _run(capsys, _argv(model_dirs, bench, out, "--overwrite"))
    assert [p for p in stale if p.exists()] == [] and kept.is_file()
    assert sorted(p.name for p in (out / "chains" / "s").iterdir()) == [".other.jsonl.k3x_9q0a.tmp", "bench.jsonl"]
