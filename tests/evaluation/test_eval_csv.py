"""``eval.csv``: the whole ``eval.json`` as one flat table (a row per pair, benchmark, mode and metric), checked
against a recorded eval.json (tests/fixtures/publish/eval: two seniors, two world benchmarks) and each of
the three shapes of eval.json, and written by ``tandem-rlvr eval`` beside eval.json."""

from __future__ import annotations

import csv
import json
import math

import pytest

from helpers.paths import ROOT

EVAL_JSON = ROOT / "tests" / "fixtures" / "publish" / "eval" / "eval.json"
Z95 = 1.959963984540054


def _read(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _leaves(metrics: dict) -> int:
    """How many numbers a metrics dict holds, ``*_se`` of another key not counted (they are its se column)."""
    n = 0
    for k, v in metrics.items():
        if k.endswith("_se") and k[:-3] in metrics:
            continue
        vals = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, list) else [v]
        n += sum(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vals)
    return n


def _row(rows, **want) -> dict:
    found = [r for r in rows if all(r[k] == v for k, v in want.items())]
    assert len(found) == 1, (want, found)
    return found[0]


def test_rows_of_a_recorded_eval(tmp_path):
    from tandem_rlvr.evaluation.report import CSV_COLUMNS, write_eval_csv

    obj = json.loads(EVAL_JSON.read_text())
    path = write_eval_csv(tmp_path / "eval.csv", obj)
    assert path.read_text().splitlines()[0] == ",".join(CSV_COLUMNS)
    assert [p.name for p in tmp_path.iterdir()] == ["eval.csv"]  # written atomically: no temporary left
    rows = _read(path)
    for senior, res in obj["seniors"].items():  # every number of eval.json has its row, and nothing else does
        for bench, m in [*res["per_benchmark"].items(), ("macro", res["macro"])]:
            got = [r for r in rows if r["senior"] == senior and r["benchmark"] == bench]
            assert len(got) == _leaves(m), (senior, bench)
            assert all(r["junior"] == "junior" for r in got)
    m = obj["seniors"]["trlvr"]["per_benchmark"]["world/val"]
    solo = _row(rows, senior="trlvr", benchmark="world/val", mode="solo", metric="pass@1")
    assert float(solo["value"]) == m["solo_pass@1"] and float(solo["se"]) == m["solo_pass@1_se"]
    lo, hi = m["solo_pass@1"] - Z95 * m["solo_pass@1_se"], m["solo_pass@1"] + Z95 * m["solo_pass@1_se"]
    assert float(solo["lo"]) == pytest.approx(max(0.0, lo)) and float(solo["hi"]) == pytest.approx(min(1.0, hi))
    assert lo < 0 and float(solo["lo"]) == 0.0  # a pass rate's interval stays in [0, 1]
    tax = _row(rows, senior="trlvr", benchmark="world/val", mode="solo-handoff", metric="communication_tax")
    t, se = m["communication_tax"], m["communication_tax_se"]
    assert float(tax["value"]) == t and float(tax["lo"]) == pytest.approx(t - Z95 * se)
    assert t - Z95 * se < 0  # points, not a fraction: not clipped at 0
    assert float(tax["hi"]) == pytest.approx(t + Z95 * se)
    hand = _row(rows, senior="trlvr", benchmark="world/val", mode="handoff", metric="pass@1")
    assert float(hand["value"]) == m["handoff_pass@1"] and float(hand["se"]) == m["handoff_pass@1_se"]
    assert float(_row(rows, senior="trlvr", benchmark="world/val", mode="curve-p0.5", metric="pass@1")["value"]) \
        == m["curve"]["0.5"]
    ce = _row(rows, senior="trlvr", benchmark="world/val", mode="solo", metric="junior_ce")
    assert float(ce["value"]) == m["junior_ce"] and ce["se"] == ce["lo"] == ce["hi"] == ""  # no s.e., no interval
    dec = [r for r in rows if r["senior"] == "trlvr" and r["benchmark"] == "world/val"
           and r["metric"].startswith("junior_ce_by_decile.")]
    assert [float(r["value"]) for r in dec] == m["junior_ce_by_decile"] and dec[0]["metric"] == "junior_ce_by_decile.1"
    macro = obj["seniors"]["small"]["macro"]
    assert float(_row(rows, senior="small", benchmark="macro", mode="solo", metric="pass@1")["value"]) == macro["solo_pass@1"]
    assert not [r for r in rows if r["metric"].endswith("_se") or r["metric"] == "vocabulary"]


def test_pair_names_in_every_shape_of_eval_json():
    from tandem_rlvr.evaluation.report import csv_rows

    m = {"solo_pass@1": 0.5, "solo_pass@1_se": 0.1, "junior_bpb": 1.25, "junior_ce": "n/a (different tokenizers)"}
    res = {"per_benchmark": {"b": m}, "macro": m}
    one = {"senior": "s", "junior": "j", **res, "settings": {}}
    several = {"seniors": {"s1": {**res, "junior": "j"}, "s2": {**res, "junior": "j"}}, "settings": {}}
    pairs = {"pairs": {"s+j1": {"senior": "s", "junior": "j1", **res}, "s+j2": {"senior": "s", "junior": "j2", **res}},
             "settings": {}}
    old = {"senior": "s", **res, "settings": {"junior": "/models/tiny-junior/"}}  # no junior in the result
    assert {(r[0], r[1]) for r in csv_rows(one)} == {("s", "j")}
    assert {(r[0], r[1]) for r in csv_rows(several)} == {("s1", "j"), ("s2", "j")}
    assert {(r[0], r[1]) for r in csv_rows(pairs)} == {("s", "j1"), ("s", "j2")}
    assert {(r[0], r[1]) for r in csv_rows(old)} == {("s", "tiny-junior")}
    rows = csv_rows(one)  # a string marker has no row; a number without an s.e. has no interval
    assert [r[2:6] for r in rows] == [["b", "solo", "pass@1", 0.5], ["b", "solo", "junior_bpb", 1.25],
                                      ["macro", "solo", "pass@1", 0.5], ["macro", "solo", "junior_bpb", 1.25]]
    assert rows[1][6:] == ["", "", ""] and rows[0][6] == 0.1
    with pytest.raises(ValueError, match="not an eval.json"):
        csv_rows({"settings": {}})


def test_cli_eval_writes_the_csv_beside_eval_json(tmp_path):
    """One world problem, one sample, no curve: the CSV ``eval`` writes is the table of the eval.json it writes."""
    from tandem_rlvr.cli import main
    from tandem_rlvr.evaluation.report import CSV_COLUMNS, csv_rows
    from tandem_rlvr.world.build import prebuilt_world

    root = prebuilt_world()
    assert root is not None
    out = tmp_path / "out"
    assert main(["eval", "--senior", f"base={root / 'senior'}", "--junior", str(root / "junior"), "--benchmark",
                 "arith/test", "--limit", "1", "--n", "1", "--max-new-tokens", "16", "--no-curve", "--reward-workers",
                 "1", "--no-progress", "--out", str(out)]) == 0
    rows = _read(out / "eval.csv")
    want = csv_rows(json.loads((out / "eval.json").read_text()))
    assert len(rows) == len(want) > 10
    assert [[r[c] for c in CSV_COLUMNS] for r in rows] == [[str(x) for x in w] for w in want]
    assert _row(rows, senior="base", benchmark="arith/test", mode="all", metric="n_problems")["value"] == "1"


def test_eval_json_and_its_parts_are_strict_json_and_a_resumed_run_reads_their_nulls(model_dirs, tmp_path):
    """Chains of 4 tokens leave deciles of the junior's CE empty: null in eval.json and the part (a bare NaN is no
    JSON: jq, JavaScript and pandas refuse the file); the rerun that reuses the part gives the same eval.json."""
    from tandem_rlvr.cli import main

    s_dir, j_dir = model_dirs
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} plus 4?", "answer": str(i + 4)}) + "\n"
                             for i in range(2)), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["eval", "--senior", f"s={s_dir}", "--junior", str(j_dir), "--benchmark", str(bench), "--out", str(out),
            "--n", "1", "--max-new-tokens", "4", "--no-curve", "--no-progress", "--reward", "boxed_exact"]
    assert main(argv) == 0

    def strict(path):
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=lambda c: pytest.fail(f"{c} in {path}"))

    first = strict(out / "eval.json")
    assert None in first["macro"]["junior_ce_by_decile"], "the fixture must leave a decile empty"
    assert None in strict(out / "parts" / "s__bench.json")["metrics"]["junior_ce_by_decile"]
    for line in (out / "chains" / "s" / "bench.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in a chain"))
    assert main(argv) == 0  # resumed: the part's nulls read back
    again = strict(out / "eval.json")
    assert again["macro"] == first["macro"] and again["per_benchmark"] == first["per_benchmark"]
    assert "Junior CE by position" in (out / "eval.md").read_text(encoding="utf-8")  # the report reads the nulls
