"""``tandem-rlvr eval`` refuses what would give a wrong or empty result: one line naming the flag or file, exit
code 2, before any model's weights load (docs/evaluation.md); and its report shows only its own chains.

The refusals run with ``load_causal_lm`` replaced by a stand-in that fails the test if called.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.cli_runs import refused as _refused


def _bench(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def bench(tmp_path):
    return _bench(tmp_path / "bench.jsonl", [{"id": f"p{i}", "problem": f"What is {i} plus 4?", "answer": str(i + 4)}
                                             for i in range(3)])


def _argv(model_dirs, bench, out, *extra):
    s_dir, j_dir = model_dirs
    return ["eval", "--senior", f"s={s_dir}", "--junior", str(j_dir), "--benchmark", bench, "--out", str(out),
            "--n", "1", "--max-new-tokens", "4", "--no-curve", "--no-progress", "--reward", "boxed_exact", *extra]


@pytest.mark.parametrize("extra,words", [
    (["--reward", "mth"], ["--reward", "math, gsm8k, boxed_exact", "'mth'"]),
    (["--device", "gpu"], ["--device", "'gpu'"]),
    (["--limit", "0"], ["--limit", ">= 1"]),
    (["--context", "3"], ["--context 3", "'bench'", "senior 's'"]),
])
def test_a_bad_option_is_one_line_before_any_model_loads(model_dirs, bench, tmp_path, capsys, no_weights, extra,
                                                         words):
    _refused(capsys, _argv(model_dirs, bench, tmp_path / "out", *extra), *words)


def test_a_cuda_device_without_cuda_is_refused(model_dirs, bench, tmp_path, capsys, no_weights, monkeypatch):
    """On any machine: torch is made to see no GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for device in ("cuda", "cuda:1"):
        _refused(capsys, _argv(model_dirs, bench, tmp_path / "out", "--device", device), "--device", "no CUDA device")


def test_duplicate_problem_ids_name_the_benchmark_file(model_dirs, tmp_path, capsys, no_weights):
    dup = _bench(tmp_path / "dup.jsonl", [{"id": "a", "problem": "What is 0 plus 1?", "answer": "1"},
                                          {"id": "a", "problem": "What is 1 plus 1?", "answer": "2"},
                                          {"id": "b", "problem": "What is 2 plus 1?", "answer": "3"}])
    _refused(capsys, _argv(model_dirs, dup, tmp_path / "out"), dup, "'a'", "--id-key")


def test_a_typo_in_a_built_in_split_lists_the_splits(model_dirs, tmp_path, capsys, no_weights):
    _refused(capsys, _argv(model_dirs, "arith/tset", tmp_path / "out"), "arith/tset", "'test'", "'train'")


def test_seniors_or_benchmarks_that_make_one_file_name_are_refused(model_dirs, tmp_path, capsys, no_weights):
    """'a b' and 'a_b' would write one chains/a_b/ (seniors) or one a_b.jsonl (benchmarks): nothing is written."""
    s_dir, j_dir = model_dirs
    rows = [{"id": "p", "problem": "What is 1 plus 1?", "answer": "2"}]
    (tmp_path / "d").mkdir()
    b1, b2 = _bench(tmp_path / "a b.jsonl", rows), _bench(tmp_path / "d" / "a_b.jsonl", rows)
    out = tmp_path / "out"
    seniors = ["--senior", f"a b={s_dir}", "--senior", f"a_b={s_dir}"]
    _refused(capsys, ["eval", *seniors, "--junior", str(j_dir), "--benchmark", b1, "--out", str(out)],
             "seniors 'a b' and 'a_b'", "chains/a_b/")
    _refused(capsys, ["eval", "--senior", str(s_dir), "--junior", str(j_dir), "--benchmark", b1, "--benchmark", b2,
                      "--out", str(out)], "benchmarks 'a b' and 'a_b'")
    assert not out.exists()  # refused before anything was written


def test_pairs_that_make_one_file_name_are_refused(model_dirs, bench, tmp_path, capsys, no_weights):
    """With two juniors a pair's label is SENIOR+JUNIOR: 'x+y' with junior 'z' and 'x' with junior 'y+z' clash."""
    s_dir, j_dir = model_dirs
    argv = ["eval", "--senior", f"x+y={s_dir}", "--senior", f"x={s_dir}", "--junior", f"z={j_dir}",
            "--junior", f"y+z={j_dir}", "--benchmark", bench, "--out", str(tmp_path / "out"), "--no-progress"]
    _refused(capsys, argv, "'x+y+z'", "pairs")


def _browser_runs(out):
    page = (out / "eval.html").read_text(encoding="utf-8")
    data = json.loads(page.split("<script type='application/json' id='chain-data'>")[1].split("</script>")[0])
    return sorted(r["id"] for r in data["runs"])


def test_the_report_shows_only_this_runs_chains(model_dirs, bench, tmp_path, capsys):
    """An earlier run's chains under the same --out stay on disk (not ours to delete) but are not this report's
    (another evaluation into that --out replaces its report only with --overwrite: tests/evaluation/test_eval_out.py)."""
    from tandem_rlvr.cli import main

    s_dir, j_dir = model_dirs
    out = tmp_path / "out"
    base = ["--junior", str(j_dir), "--benchmark", bench, "--out", str(out), "--n", "1", "--max-new-tokens", "4",
            "--no-curve", "--no-progress", "--reward", "boxed_exact"]
    assert main(["eval", "--senior", f"first={s_dir}", *base]) == 0
    assert _browser_runs(out) == ["first/bench"]
    assert main(["eval", "--senior", f"second={s_dir}", *base, "--overwrite"]) == 0
    assert _browser_runs(out) == ["second/bench"]
    assert (out / "chains" / "first" / "bench.jsonl").is_file()


def test_a_finished_part_of_other_options_is_kept_and_the_rerun_refused(model_dirs, bench, tmp_path, capsys,
                                                                       monkeypatch):
    """Another --n (or any option of the fingerprint) under the same --out would recompute and replace the
    finished part, its chains and eval.json: refused before any weights load, naming what changed and
    --overwrite; nothing under --out changes. A part of an older version (no recorded inputs) is refused alike,
    and still reused where its fingerprint matches."""
    import tandem_rlvr.models as models
    from tandem_rlvr.cli import main

    out = tmp_path / "out"
    argv = _argv(model_dirs, bench, out)
    assert main(argv) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in files}
    load = models.load_causal_lm
    monkeypatch.setattr(models, "load_causal_lm", lambda name, **_: pytest.fail(f"{name} loaded before the refusal"))
    other = [*argv, "--n", "2", "--top-k", "5"]  # --n 1 -> 2, --top-k 20 -> 5
    err = _refused(capsys, other, "parts/s__bench.json", "--n 1 -> 2", "--top-k 20 -> 5", "--overwrite", "another --out")
    assert "Traceback" not in err
    assert {p: p.read_bytes() for p in files} == before  # nothing replaced
    # a part written before the inputs were recorded: refused alike when it differs...
    part = out / "parts" / "s__bench.json"
    saved = json.loads(part.read_text(encoding="utf-8"))
    del saved["inputs"]
    part.write_text(json.dumps(saved), encoding="utf-8")
    _refused(capsys, other, "parts/s__bench.json", "other options", "--overwrite")
    # ...and resumed (not recomputed) where its fingerprint is this run's
    monkeypatch.setattr(models, "load_causal_lm", load)
    chains = out / "chains" / "s" / "bench.jsonl"
    assert main(argv) == 0 and chains.read_bytes() == before[chains]
    assert json.loads(part.read_text(encoding="utf-8")) == saved


@pytest.mark.parametrize("role", ["senior", "junior"])
def test_a_tokenizer_longer_than_the_models_output_layer_is_one_line(model_dirs, bench, tmp_path, capsys, role):
    """A token id past the output rows would index past the embeddings (an IndexError mid-run): each model eval
    loads is checked against its own tokenizer, as training checks the senior."""
    import shutil

    from transformers import AutoTokenizer

    s_dir, j_dir = model_dirs
    big = tmp_path / "big"
    shutil.copytree(s_dir if role == "senior" else j_dir, big)
    tok = AutoTokenizer.from_pretrained(str(big))
    tok.add_tokens(["apples"])
    tok.save_pretrained(str(big))
    dirs = (big, j_dir) if role == "senior" else (s_dir, big)
    _refused(capsys, _argv(dirs, bench, tmp_path / "out"), f"{role} ", repr(str(big)), f"{len(tok)} tokens",
             f"only {len(tok) - 1} rows")


def test_a_model_too_short_for_the_prompts_themselves_is_told_so_not_a_negative_budget(model_dirs, bench, tmp_path,
                                                                                       capsys, no_weights):
    """A senior whose context is shorter than its longest prompt: no --max-new-tokens fits, so the refusal says the
    prompts do not fit and gives the --context that skips them, never a --max-new-tokens <= 0."""
    import shutil

    s_dir, j_dir = model_dirs
    short = tmp_path / "short"
    shutil.copytree(s_dir, short)
    config = json.loads((short / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = 8
    (short / "config.json").write_text(json.dumps(config), encoding="utf-8")
    err = _refused(capsys, _argv((short, j_dir), bench, tmp_path / "out"), "reads 8 tokens", "prompts alone do not fit",
                   "--context <= 8")
    assert "--max-new-tokens <=" not in err
