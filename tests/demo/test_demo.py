"""`tandem-rlvr demo --quick` runs end to end and writes every output (world from the shared fixture)."""

import json
import os
import re
import shutil

import pytest

from tandem_rlvr.cli import main
from tandem_rlvr.demo import QUICK, run_names
from tandem_rlvr.demo.report import METRICS

# --quick draws 2 samples per problem, so pass@k exists for k <= 2 only
EVAL_KEYS = [k for k, *_ in METRICS if k != "solo_pass@4"] + ["curve", "solo_pass@2", "n_problems"]
CURVE_KEYS = ("step", "reward/mean", "rollout/senior_token_frac", "kl/senior_junior", "rollout/jargon_rate")
SENIOR_KEYS = ("senior/solo_pass@1", f"senior/solo_pass@{QUICK.val_n}", "senior/jargon_rate", "senior/kl_exact",
               "senior/junior_ce")
RUNS = run_names(QUICK)


@pytest.fixture(scope="module")
def quick_demo(world, tmp_path_factory):
    """One ``tandem-rlvr demo --quick`` shared by this module's tests (each works on its own copy)."""
    paths, _ = world
    out = tmp_path_factory.mktemp("quick_demo") / "demo"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
        assert main(["demo", "--quick", "--workers", "2", "--out", str(out)]) == 0
    return out


def test_demo_quick_writes_every_output(quick_demo, tmp_path, world, monkeypatch):
    paths, _ = world
    monkeypatch.setenv("TANDEM_RLVR_CACHE", str(paths.root.parent))
    out = tmp_path / "demo"
    shutil.copytree(quick_demo, out)
    results = json.loads((out / "results.json").read_text())
    for key in EVAL_KEYS:
        assert key in results["warm_start"], key
    assert set(results["arms"]) == set(RUNS) and len(RUNS) == 2 + len(QUICK.kl_betas) >= 5
    for run in RUNS:
        seeds = results["arms"][run]
        assert list(seeds) == ["0"], run
        for key in EVAL_KEYS:
            assert key in seeds["0"], (run, key)
        rows = results["curves"][run]["0"]
        assert rows and all(k in rows[-1] for k in CURVE_KEYS), (run, rows[-1])
        val_steps = [r["step"] for r in rows if all(k in r for k in SENIOR_KEYS)]
        assert val_steps == list(range(QUICK.val_every, QUICK.steps + 1, QUICK.val_every)), run
        assert (out / "chains" / f"{run}-seed0.jsonl").is_file()
    assert set(results["senior_alone_step0"]) == set(SENIOR_KEYS)
    assert results["warm_start"]["checkpoint_step"] == 0
    for run in RUNS:  # the evaluated checkpoint, by hand from the recorded validation rows: best pass@2, earliest on ties
        vals = [(r["step"], r[f"senior/solo_{QUICK.select}"]) for r in results["curves"][run]["0"]
                if f"senior/solo_{QUICK.select}" in r]
        top = max(v for _, v in vals)
        assert results["arms"][run]["0"]["checkpoint_step"] == min(s for s, v in vals if v == top), (run, vals)
    # kl_reg at each beta really trained with that beta
    for beta in QUICK.kl_betas:
        cfg = (out / "runs" / f"kl_reg@{float(beta):g}-seed0" / "config.yaml").read_text()
        assert f"kl_beta: {float(beta)}" in cfg, beta
    report = (out / "report.md").read_text()
    assert "## Claims" in report and report.count("\n1. ") == 1 and "5. KL-Reg" in report
    assert f"; token budget {QUICK.max_new_tokens}; junior: weak. " in report  # the shipped build: no build seed named
    claim_lines = [line for line in report.split("## Claims")[1].splitlines() if line[:2] in ("1.", "2.", "3.", "4.", "5.")]
    assert "**Direction only**" in report and len(claim_lines) == 5
    assert all("direction only (one seed)" in line for line in claim_lines), claim_lines
    for p in QUICK.curve_ps:
        assert f"word tandem pass@1, p={float(p)} |" in report
    for png in ("tradeoff.png", "training_curves.png", "senior_alone_curves.png", "claims.png"):
        assert (out / png).stat().st_size > 1000
        assert f"]({png})" in report
    assert (out / "report.html").stat().st_size > 10_000
    assert (out / "runs" / "trlvr-seed0" / "final" / "model.safetensors").exists()

    assert results["workers"] == 2
    # A killed demo resumes after its last finished evaluation: drop kl_reg's entries (as if killed while
    # it trained) and the finished-run marker; the rerun trains only kl_reg and keeps the other numbers.
    # The rerun has one job, so it runs in this process: its numbers equal those of the worker process.

    partial = json.loads((out / "results.json").read_text())
    kept = {arm: partial["arms"][arm]["0"] for arm in RUNS if arm != "kl_reg@0.1"}
    in_worker = (partial["arms"]["kl_reg@0.1"]["0"], partial["curves"]["kl_reg@0.1"]["0"])
    del partial["arms"]["kl_reg@0.1"]["0"], partial["curves"]["kl_reg@0.1"]["0"], partial["total_s"]
    (out / "results.json").write_text(json.dumps(partial))
    for arm in RUNS:
        shutil.rmtree(out / "runs" / f"{arm}-seed0")
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["resumed"] is True and set(resumed["arms"]["kl_reg@0.1"]) == {"0"}
    for arm, metrics in kept.items():
        assert resumed["arms"][arm]["0"] == metrics
        assert not (out / "runs" / f"{arm}-seed0").exists(), f"{arm} was trained again"
    assert (out / "runs" / "kl_reg@0.1-seed0" / "final" / "model.safetensors").exists()
    assert resumed["workers"] == 1
    assert _untimed(resumed["arms"]["kl_reg@0.1"]["0"]) == _untimed(in_worker[0])
    assert _untimed(resumed["curves"]["kl_reg@0.1"]["0"]) == _untimed(in_worker[1])


def _untimed(x):
    """``x`` without wall-clock entries (the only thing that may differ between two equal runs)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not k.startswith("time/")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_demo_worker_count_is_checked_and_capped_by_the_jobs():
    import pytest

    from tandem_rlvr.demo.jobs import n_workers
    from tandem_rlvr.errors import TandemError

    with pytest.raises(TandemError, match="workers must be >= 1"):
        n_workers(0, 4)
    assert n_workers(8, 3) == 3 and n_workers(2, 10) == 2 and n_workers(None, 1) == 1


INJECTED = ("<script>document.body.setAttribute('data-pwned','script')</script></script>"
            "<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    msg = "no Chromium found: install Debian's package (apt-get install -y chromium) to run the browser test"
    if os.environ.get("TANDEM_RLVR_REQUIRE_BROWSER") == "1":  # set by .ci/run: CI must run this test
        pytest.fail(msg)
    pytest.skip(msg)


def _browse(browser: str, url: str, *extra: str) -> str:
    import subprocess

    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           "--virtual-time-budget=5000", "--window-size=1400,2600", *extra, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _view(browser: str, html_file, **state) -> tuple[str, list[str]]:
    """The DOM after the page's script ran for the view ``state``; and its chain elements."""
    from urllib.parse import quote

    url = html_file.resolve().as_uri() + "#" + "&".join(f"{k}={quote(str(v))}" for k, v in state.items())
    dom = _browse(browser, url, "--dump-dom")
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    pieces = dom.split("</main>")[0].split('<div class="chain"')[1:]  # each runs from a chain to the next one
    return dom, [(p.split("</b>")[0], p) for p in pieces]  # (opening tag and title, the whole piece)


def test_report_html_in_a_real_browser(quick_demo, tmp_path):
    """report.html in headless Chromium: chains per view, author classes, filters computed as in Python,
    and a chain holding <script> / onerror markup shows as text without running."""
    from tandem_rlvr.demo.report import write_report

    browser = _chromium()
    out = tmp_path / "demo"
    shutil.copytree(quick_demo, out)
    path = out / "chains" / "trlvr-seed0.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    victim = next(r for r in records if r["mode"] == "solo")
    victim["turns"][0][1] = INJECTED + victim["turns"][0][1]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report(json.loads((out / "results.json").read_text()), out)
    page = out / "report.html"

    per_sample = 2 + sum(1 for p in QUICK.curve_ps if float(p) != 1.0)  # solo, step handoff, word handoffs
    dom, chains = _view(browser, page, run="trlvr-seed0", filter="all", page=0, problem=victim["problem_id"])
    body_tag = re.search(r"<body[^>]*>", dom).group(0)
    assert "data-pwned" not in body_tag and 'data-ready="1"' in body_tag, f"a script inside a chain ran: {body_tag}"
    assert "&lt;script&gt;document.body.setAttribute" in dom and "&lt;img src=x onerror" in dom
    assert len(chains) == per_sample * QUICK.eval_n == int(re.search(r'data-chains-shown="(\d+)"', dom).group(1))
    assert 'class="legend"' in dom and "Problem " + victim["problem_id"] in dom
    owners = {(r["sample"], r["mode"]): {o for o, _ in r["turns"]} for r in records if r["problem_id"] == victim["problem_id"]}
    n_senior = sum(1 for r in records if r["problem_id"] == victim["problem_id"] for o, _ in r["turns"] if o == "senior")
    n_junior = sum(1 for r in records if r["problem_id"] == victim["problem_id"] for o, _ in r["turns"] if o == "junior")
    assert dom.count('class="turn senior"') == n_senior + 1 and dom.count('class="turn junior"') == n_junior + 1  # + legend
    assert owners[(0, "solo")] == {"senior"}
    solo_chain = next(c for head, c in chains if "solo (senior alone)" in head)
    assert 'class="turn junior"' not in solo_chain

    # "solo right but team wrong": the first matching problem, as the page computes it, from Python's records
    by = {(r["problem_id"], r["sample"], r["mode"]): r["reward"] for r in records}
    order = list(dict.fromkeys(r["problem_id"] for r in records))
    tax = [(pid, s) for pid in order for s in range(QUICK.eval_n)
           if by.get((pid, s, "solo")) == 1.0 and by.get((pid, s, "handoff")) == 0.0]
    dom, chains = _view(browser, page, run="trlvr-seed0", filter="tax", page=0, problem="")
    if tax:
        first = tax[0][0]
        assert "Problem " + first in dom
        assert len(chains) == per_sample * sum(1 for pid, _ in tax if pid == first)
        assert all('data-correct="1"' in head for head, _ in chains if "solo (senior alone)" in head)
        assert all('data-correct="0"' in head for head, _ in chains if "step handoff" in head)
    else:
        assert "No problem matches this filter." in dom and not chains

    shot = tmp_path / "report.png"
    _browse(browser, page.resolve().as_uri() + f"#run=trlvr-seed0&filter=all&page=0&problem={victim['problem_id']}",
            f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000
