"""Self-contained HTML reports (``report.html`` for the demo, ``eval.html`` for ``tandem-rlvr eval``).

One file, no server and no network: inline CSS and JavaScript, plots as ``data:`` URIs, the tables
of the Markdown report, and a **chain browser**: pick a run (arm / seed, or senior / benchmark), a
filter and a problem; the solo chain and the step-handoff chain of each sample are shown side by
side (word-handoff chains below, where sampled), every turn coloured by its author.

Safety and size: every chain is data in one ``<script type="application/json">`` element, written
with ``<``, ``>``, ``&`` and the two JavaScript line separators escaped as ``\\uXXXX`` so no text in
a chain can close the element; the page's script inserts model text with ``textContent`` only, and
renders only the problem on screen (a page of 40 problem links at a time), so thousands of chains
load at once as one JSON parse.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from tandem_rlvr.io import atomic_write_text

_JS_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_for_script(obj) -> str:
    """``obj`` as JSON that is safe inside ``<script type="application/json">`` (no ``</script>``,
    no ``<!--``, no raw line separators)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: _JS_ESCAPES[m.group(0)], text)


# -- Markdown (the subset our reports write) to HTML -----------------------------------------------

def _inline(text: str) -> str:
    s = html.escape(text, quote=False)
    s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", s)


def _image(alt: str, name: str, base: Path) -> str:
    path = base / name
    if "/" in name or "\\" in name or not path.is_file():
        return f"<p class='missing'>[missing plot {html.escape(name)}]</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<figure><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></figure>"


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    head, body = cells[0], [r for r in cells[2:]]
    out = ["<table><thead><tr>", *(f"<th>{_inline(c)}</th>" for c in head), "</tr></thead><tbody>"]
    for r in body:
        out += ["<tr>", *(f"<td>{_inline(c)}</td>" for c in r), "</tr>"]
    return "".join(out + ["</tbody></table>"])


def markdown_to_html(md: str, base: Path) -> str:
    """Headings, tables, list items, images (inlined from ``base``) and paragraphs; all text escaped."""
    out, lines, i = [], md.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        img = re.fullmatch(r"!\[([^\]]*)\]\(([^)]+)\)", line.strip())
        if img:
            out.append(_image(img.group(1), img.group(2), base))
        elif m := re.match(r"(#{1,3}) (.*)", line):
            n = len(m.group(1))
            out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif m := re.match(r"(\s*)(\d+\.|-) (.*)", line):
            cls = "item sub" if m.group(1) else "item"
            out.append(f"<p class='{cls}'>{_inline(m.group(2) + ' ' + m.group(3))}</p>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


# -- chain data ---------------------------------------------------------------------------------------

def _turns(rec: dict) -> list:
    turns = rec.get("turns") or []
    if turns and isinstance(turns[0], dict):
        turns = [[t.get("owner", "senior"), t.get("text", "")] for t in turns]
    if not turns and rec.get("text") is not None:
        turns = [["senior", rec["text"]]]
    return [["s" if o == "senior" else "j", str(t)] for o, t in turns]


def _answer(rec: dict):
    if "answer" in rec:
        return rec["answer"]
    from tandem_rlvr.rewards import extract_boxed

    return extract_boxed("".join(t for _, t in _turns(rec)))


def chain_run(run_id: str, label: str, records, problems: dict | None = None) -> dict:
    """One browsable run from chain records (``problem_id``, ``sample``, ``mode``, ``reward``, ``gold``,
    ``turns``): ``{"id", "label", "problems": [{"id", "gold", "q", "chains": {mode: [[sample, correct,
    answer, turns]]}}]}``."""
    by_pid: dict = {}
    for rec in records:
        pid = str(rec["problem_id"])
        p = by_pid.setdefault(pid, {"id": pid, "gold": str(rec.get("gold", "")),
                                    "q": (problems or {}).get(pid, ""), "chains": {}})
        p["chains"].setdefault(rec["mode"], []).append(
            [int(rec.get("sample", 0)), 1 if float(rec.get("reward", 0.0)) >= 0.5 else 0, _answer(rec), _turns(rec)])
    for p in by_pid.values():
        for rows in p["chains"].values():
            rows.sort(key=lambda r: r[0])
    return {"id": run_id, "label": label, "problems": list(by_pid.values())}


def read_chains(path: Path) -> list[dict]:
    """The chain records of a chains file (written whole, never appended to): one per non-blank line; a
    line that is not JSON raises (unlike :func:`tandem_rlvr.io.read_jsonl`, which drops a log's torn tail)."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# -- the page -----------------------------------------------------------------------------------------

def page(title: str, body_html: str, runs: list[dict]) -> str:
    """The whole HTML document: report body, then the chain browser over ``runs``."""
    from tandem_rlvr.evaluation.html_assets import CSS, JS

    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><style>{CSS}</style></head><body>"
            f"<main>{body_html}\n<h2 id='chains'>Chain browser</h2>"
            f"<div id='browser'><noscript>The chain browser needs JavaScript.</noscript></div></main>"
            f"<script type='application/json' id='chain-data'>{json_for_script({'runs': runs})}</script>"
            f"<script>{JS}</script></body></html>\n")


def eval_html(out_dir: str | Path, problems: dict | None = None, chains: list | None = None) -> Path:
    """``eval.html`` beside ``eval.md``: its tables and plots, and the chains of ``chains`` (paths under ``out_dir``,
    ``chains/<senior>/<benchmark>.jsonl``: the run's own; None: every such file there, whichever run wrote it);
    ``problems``: ``{benchmark: {problem_id: problem text}}`` (optional)."""
    out = Path(out_dir)
    runs = []
    paths = sorted((out / "chains").glob("*/*.jsonl")) if chains is None else [out / c for c in chains]
    for path in paths:
        records = read_chains(path)
        senior = str(records[0].get("senior", path.parent.name)) if records else path.parent.name
        bench = str(records[0].get("benchmark", path.stem)) if records else path.stem
        runs.append(chain_run(f"{path.parent.name}/{path.stem}", f"{senior} · {bench}", records,
                              (problems or {}).get(bench)))
    md = out / "eval.md"
    body = markdown_to_html(md.read_text(encoding="utf-8"), out) if md.is_file() else "<h1>Tandem RLVR evaluation</h1>"
    target = out / "eval.html"
    atomic_write_text(target, page("Tandem RLVR evaluation", body, runs))
    return target


def read_problems(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
