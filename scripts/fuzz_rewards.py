#!/usr/bin/env python
"""Fuzz the answer verifier: adversarial completions and golds must never raise or overrun the limit.

    python scripts/fuzz_rewards.py --n 10000 [--limit 1.0] [--seed 0]

Draws ``--n`` (completion, gold, reward kind) triples from the hypothesis strategies below (random
unicode, 100k-char strings, braces and boxes nested 10k deep, towers of powers, lone backslashes,
unclosed boxes, broken LaTeX), scores each with one :class:`~tandem_rlvr.rewards.RewardScorer` and
times the call (the workers are made ready, untimed, before each call: start-up is not part of the
limit). Prints one summary line::

    fuzz_rewards: n=10000 max_latency_s=0.862 over_limit=0 timeouts=812 errors=3 exceptions=0 ...

and exits 1 if any call raised, returned something other than 0.0 / 1.0, or took longer than
``limit + slack``. ``tests/rewards/test_reward_fuzz.py`` runs the same strategies on a few dozen examples.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import strategies as st

B = "\\boxed"
MAX_CHARS = 100_000

# Pieces that matter to a brace matcher, a LaTeX parser or a pipe: boxes, braces, backslashes,
# commands with missing arguments, answer markers, NUL, lone surrogates, combining marks, RTL
# overrides, full-width and non-ASCII digits, emoji.
ATOMS = [
    "{", "}", "\\", "\\\\", "\\{", "\\}", B, B + "{", "\\fbox{", B + " ", "\\boxed{}", "$", "$$", "^", "_",
    "9", "1", "0", "x", "-", "+", "*", "/", "=", "!", ",", ".", "%", "(", ")", "[", "]", "|", "&", " ",
    "\n", "\t", "\\frac", "\\frac{", "\\dfrac{1}{", "\\sqrt", "\\sqrt[", "\\left(", "\\right)", "\\left\\{",
    "\\begin{pmatrix}", "\\end{pmatrix}", "\\begin{cases}", "\\infty", "\\pi", "\\text{", "\\mathrm{",
    "\\cdot", "\\times", "\\pm", "^\\circ", "\\%", "####", "\\,", "\\!", "\\ ", "e", "E", "i", "\\in",
    "\\cup", "\\emptyset", "\x00", "\ud800", "\udfff", "\u0301", "\u202e", "\u200b", "\ufeff", "é",
    "１", "٣", "\u00b2", "😀", "𝟙", "∞", "√", "½",
]

TOWERS = [
    "9^{9^{9^9}}", "2^{2^{2^{2^{2^{2}}}}}", "10^{10^{10^{10}}}", "(10^{1000})!", "100000!",
    "\\binom{10^{9}}{10^{5}}", "1e999999", "2**2**2**2**30", "9^9^9^9^9", "10^{-10^{10}}",
    "\\sqrt{10^{10^{10}}}", "\\frac{10^{10^{10}}}{3}", "\\prod_{n=1}^{10^{9}} n", "\\sum_{n=1}^{\\infty} n^{n}",
    "x^{x^{x^{x^{x}}}}", "(1+10^{-100})^{10^{100}}", "\\lim_{n\\to\\infty} n!", "0^{0}", "\\frac{1}{0}",
    "0/0", "\\infty-\\infty", "{}^{}_{}", "\\boxed{\\boxed{\\boxed{}}}",
]

GOLDS = ["1", "0", "-3", "\\frac{1}{2}", "0.5", "42", "x=3", "(0,1]", "\\{1,2\\}", "2\\sqrt{3}", "50\\%",
         "10^{100}", "", " ", "#### 72", "\\boxed{7}", "\\pi", "e^{i\\pi}"]


def _cap(s: str) -> str:
    return s[:MAX_CHARS]


def _box(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``inner`` inside a box: closed, unclosed, bare, doubled, or after a long preamble."""
    return st.tuples(inner, st.sampled_from(["closed", "unclosed", "bare", "double", "fbox", "prefixed"])).map(
        lambda t: {
            "closed": f"{B}{{{t[0]}}}",
            "unclosed": f"{B}{{{t[0]}",
            "bare": f"{B} {t[0]}",
            "double": f"{B}{{{B}{{{t[0]}}}}}",
            "fbox": f"\\fbox{{{t[0]}}}",
            "prefixed": f"So the answer is ${B}{{{t[0]}}}$.",
        }[t[1]]
    )


def _soup(max_size: int = 60, min_size: int = 0) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(ATOMS), min_size=min_size, max_size=max_size).map("".join)


def _huge() -> st.SearchStrategy[str]:
    """Up to 100k characters: a short piece repeated, optionally with a box before, after or inside."""
    piece = st.one_of(st.sampled_from(ATOMS), _soup(8, min_size=1), st.text(min_size=1, max_size=8))
    where = st.sampled_from(["none", "before", "after", "middle"])
    answer = st.sampled_from(["1", "\\frac{1}{2}", "9^{9^9}"])

    def build(t: tuple) -> str:
        unit, size, at, ans = t
        body, box = (unit * (size // len(unit) + 1))[:size], f"{B}{{{ans}}}"
        half = len(body) // 2
        out = {"none": body, "before": box + body, "after": body + box, "middle": body[:half] + box + body[half:]}[at]
        return _cap(out)

    return st.tuples(piece, st.integers(1, MAX_CHARS), where, answer).map(build)


def _nested() -> st.SearchStrategy[str]:
    """Openers nested up to 10k deep, balanced or not, inside or around a box."""
    opener = st.sampled_from(["{", B + "{", "\\frac{1}{", "\\sqrt{", "(", "^{", "\\left(", "[", "\\{", "\\text{"])
    closer = {"{": "}", B + "{": "}", "\\frac{1}{": "}", "\\sqrt{": "}", "(": ")", "^{": "}", "\\left(": "\\right)",
              "[": "]", "\\{": "\\}", "\\text{": "}"}

    def build(t: tuple) -> str:
        op, depth, balanced, boxed = t
        body = op * depth + "1" + (closer[op] * depth if balanced else closer[op] * (depth // 2))
        return _cap(f"{B}{{{body}}}" if boxed else body)

    return st.tuples(opener, st.integers(1, 10_000), st.booleans(), st.booleans()).map(build)


def _tower() -> st.SearchStrategy[str]:
    """Huge powers and other expressions whose evaluation explodes."""
    built = st.tuples(st.integers(2, 99), st.integers(2, 7)).map(
        lambda t: "{".join([f"{t[0]}^"] * t[1]) + str(t[0]) + "}" * (t[1] - 1))
    return st.one_of(st.sampled_from(TOWERS), built)


def completions() -> st.SearchStrategy[str]:
    """Random and adversarial completions (at most 100k characters)."""
    return st.one_of(
        st.text(max_size=300),  # random unicode
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=100),  # surrogates too
        _soup(),
        _box(_soup(30)),
        _box(st.text(max_size=50)),
        _box(_tower()),
        _huge(),
        _nested(),
        st.sampled_from(["", " ", "\\", "\\\\", "\\boxed", "\\boxed{", "\\boxed}", "\\boxed{\\}", "\\boxed{\\\\}",
                         "}}}}{{{{", "\\boxed{1}}}}", "\\boxed{{{1}", "\\boxed \\", "\\fbox", "#### ", "####"]),
    )


def golds() -> st.SearchStrategy[str]:
    """Gold answers: ordinary ones, and a few adversarial ones (a gold comes from a data file)."""
    return st.one_of(st.sampled_from(GOLDS), st.sampled_from(GOLDS), _tower(), _soup(20), st.text(max_size=30))


def cases() -> st.SearchStrategy[tuple[str, str, str]]:
    """(completion, gold, reward kind)."""
    return st.tuples(completions(), golds(), st.sampled_from(["math", "math", "gsm8k", "boxed_exact"]))


def check_one(scorer, completion: str, gold: str, kind: str, limit: float) -> tuple[float, float, dict]:
    """Score one case with ready workers; (value, seconds, stats). Raises what the scorer raises."""
    scorer.start(wait=True)  # a worker replaced after a kill starts here, outside the timed call
    t0 = time.perf_counter()
    values, stats = scorer.score([completion], [gold], reward=kind, time_limit=limit)
    return values[0], time.perf_counter() - t0, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="inputs to try (default 10000)")
    ap.add_argument("--limit", type=float, default=1.0, help="time limit of one check in seconds (default 1)")
    ap.add_argument("--slack", type=float, default=1.0, help="allowed latency over the limit (default 1 s)")
    ap.add_argument("--workers", type=int, default=2, help="verifier worker processes (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    ap.add_argument("--every", type=int, default=1000, help="print progress every N inputs (0 = never)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from tandem_rlvr.rewards import RewardScorer

    tally: Counter = Counter()
    worst: dict = {"latency": 0.0, "case": None}
    failures: list[str] = []
    t_start = time.perf_counter()
    scorer = RewardScorer("math", num_workers=args.workers, time_limit=args.limit)
    scorer.start(wait=True)

    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(cases())
    def run(case: tuple[str, str, str]) -> None:
        completion, gold, kind = case
        tally["n"] += 1
        try:
            value, seconds, stats = check_one(scorer, completion, gold, kind, args.limit)
        except Exception as e:  # noqa: BLE001 - counted and reported, never re-raised
            tally["exceptions"] += 1
            failures.append(f"exception {type(e).__name__}: {e} on {kind} {completion[:80]!r} / {gold[:40]!r}")
            return
        tally["timeouts"] += int(stats.get("reward/timeouts", 0))
        tally["errors"] += int(stats.get("reward/errors", 0))
        tally["restarts"] += int(stats.get("reward/worker_restarts", 0))
        tally["correct"] += int(value == 1.0)
        if value not in (0.0, 1.0):
            tally["bad_values"] += 1
            failures.append(f"value {value!r} on {kind} {completion[:80]!r}")
        if seconds > worst["latency"]:
            worst.update(latency=seconds, case=(kind, len(completion), completion[:60], gold[:40]))
        if seconds > args.limit + args.slack:
            tally["over_limit"] += 1
            failures.append(f"{seconds:.2f} s on {kind} {completion[:80]!r} ({len(completion)} chars)")
        if args.every and tally["n"] % args.every == 0:
            print(f"  {tally['n']} done, {time.perf_counter() - t_start:.0f} s, max latency {worst['latency']:.3f} s, "
                  f"timeouts {tally['timeouts']}", flush=True)

    try:
        run()
    finally:
        scorer.close()
    wall = time.perf_counter() - t_start
    for f in failures[:20]:
        print("FAIL:", f)
    print(
        f"fuzz_rewards: n={tally['n']} max_latency_s={worst['latency']:.3f} limit_s={args.limit} "
        f"over_limit={tally['over_limit']} timeouts={tally['timeouts']} errors={tally['errors']} "
        f"restarts={tally['restarts']} exceptions={tally['exceptions']} bad_values={tally['bad_values']} "
        f"correct={tally['correct']} wall_s={wall:.0f}"
    )
    print(f"fuzz_rewards: slowest case: {worst['case']!r}")
    ok = not (tally["exceptions"] or tally["over_limit"] or tally["bad_values"]) and tally["n"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
