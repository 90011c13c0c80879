"""The HTML report's building blocks without a browser (the browser test is in tests/demo/test_demo.py):
chain text can never leave its JSON element, Markdown text is escaped, chains are grouped per problem."""

import json

from tandem_rlvr.evaluation.html import chain_run, json_for_script, markdown_to_html, page

EVIL = "</script><script>alert(1)</script><!-- \u2028 & <img src=x onerror=alert(2)>"


def _record(pid, sample, mode, reward, turns):
    return {"problem_id": pid, "sample": sample, "mode": mode, "reward": reward, "gold": "7",
            "turns": [{"owner": o, "text": t} for o, t in turns], "text": "".join(t for _, t in turns)}


def test_json_for_script_cannot_close_its_element_and_round_trips():
    obj = {"text": EVIL, "nested": [EVIL, {"k": EVIL}]}
    s = json_for_script(obj)
    assert not any(c in s for c in "<>&\u2028\u2029")
    assert json.loads(s) == obj


def test_page_has_exactly_its_own_two_scripts():
    run = chain_run("r", "run", [_record("p1", 0, "solo", 1.0, [("senior", EVIL)])])
    doc = page("t <b>", "<p>body</p>", [run])
    assert doc.count("<script") == 2 and doc.count("</script>") == 2 and "<title>t &lt;b&gt;</title>" in doc
    assert "innerHTML" not in doc  # model text only ever goes through textContent
    data = json.loads(doc.split("id='chain-data'>")[1].split("</script>")[0])
    assert data["runs"][0]["problems"][0]["chains"]["solo"][0][3] == [["s", EVIL]]


def test_markdown_to_html_escapes_text_and_inlines_plots(tmp_path):
    (tmp_path / "plot.png").write_bytes(b"\x89PNG fake")
    md = "# Title <x>\n\n| a | b |\n|---|---|\n| <script> | 1 |\n\n1. claim <b>\n   - sub\n\n![plot](plot.png)\n![gone](nope.png)"
    out = markdown_to_html(md, tmp_path)
    assert "<h1>Title &lt;x&gt;</h1>" in out and "<td>&lt;script&gt;</td>" in out and "<script>" not in out
    assert "<p class='item'>1. claim &lt;b&gt;</p>" in out and "item sub" in out
    assert "data:image/png;base64," in out and "missing plot nope.png" in out


def test_chain_run_groups_by_problem_with_badges_answers_and_authors():
    recs = [_record("p1", 1, "solo", 0.0, [("senior", "x \\boxed{3}")]),
            _record("p1", 0, "solo", 1.0, [("senior", "a \\boxed{7}")]),
            _record("p1", 0, "handoff", 0.0, [("senior", "a"), ("junior", " b \\boxed{5}")]),
            _record("p2", 0, "curve-p0.5", 1.0, [("junior", "c"), ("senior", " \\boxed{7}")])]
    run = chain_run("id", "label", recs, {"p1": "What is 3 + 4?"})
    p1, p2 = run["problems"]
    assert p1["q"] == "What is 3 + 4?" and p2["q"] == "" and p1["gold"] == "7"
    assert [c[0] for c in p1["chains"]["solo"]] == [0, 1]  # sorted by sample
    assert p1["chains"]["solo"][0][:3] == [0, 1, "7"] and p1["chains"]["solo"][1][:3] == [1, 0, "3"]
    assert p1["chains"]["handoff"][0][1:] == [0, "5", [["s", "a"], ["j", " b \\boxed{5}"]]]
    assert p2["chains"]["curve-p0.5"][0][3][0] == ["j", "c"]


def test_the_browsers_correct_badge_uses_the_metrics_threshold():
    """A reward of exactly 0.5 counts as correct in pass@k (reward >= 0.5); the chain browser said wrong (> 0.5)."""
    run = chain_run("r", "run", [_record("p1", 0, "solo", 0.5, [("senior", "x")]),
                                 _record("p1", 1, "solo", 0.49, [("senior", "y")])])
    rows = run["problems"][0]["chains"]["solo"]
    assert [r[1] for r in rows] == [1, 0]
