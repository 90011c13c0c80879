"""Scaling: rollout time vs response length (128 → 2048 tokens) and vs batch size (1 → 64).

Solo (senior alone) and tandem (word p = 0.5, lockstep) rollouts with EOS unreachable, so every row
writes exactly the requested number of tokens. The length sweep also runs the generic engine path
(``rollout.FAST_PATH = False``: transformers' ``DynamicCache`` + ``sdpa`` with ``repeat_kv``, i.e. the
engine before the preallocated-cache change) up to ``--baseline-max`` tokens, for contrast.

Per-token time should stay flat in length (no re-encoding: total time linear). What remains is
attention itself reading a cache that grows with the context, which no KV-cached decoder avoids.
We report the fitted exponent k of time ∝ T^k. Results go to ``scaling.json`` (merged across
sweeps), ``scaling.md`` (tables), a line per sweep in RESULTS.md, and ``scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import math

import common as C

from tandem_rlvr.engines import fastpath as R
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling

JSON = C.HERE / "scaling.json"
PNG = C.HERE / "scaling.png"
TABLE = C.HERE / "scaling.md"


def _fit_exponent(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def _run(senior, junior, tok, batch: int, tokens: int, tandem: bool, repeats: int) -> float:
    ids, mask = C.prompts(tok, batch)
    sch = make_schedule("word", tok, p=0.5) if tandem else make_schedule("none")
    kw = {"eos_token_ids": C.NO_EOS, "pad_token_id": tok.pad_token_id, "seed": 0, "record_junior": False}

    def go():
        generate(senior, junior if tandem else None, ids, mask, sch, Sampling(max_new_tokens=tokens, temperature=0.6), **kw)

    return min(C.timed(go) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", choices=["length", "batch", "both"], default="both")
    ap.add_argument("--lengths", default="128,512,2048" if C.quick() else "128,256,512,1024,2048")
    ap.add_argument("--batches", default="1,8,64" if C.quick() else "1,2,4,8,16,32,64")
    ap.add_argument("--length-batch", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=128)
    ap.add_argument("--baseline-max", type=int, default=512, help="generic path up to this length (0 = skip)")
    args = ap.parse_args()

    tok = C.tokenizer()
    V = len(tok)
    senior, junior = C.model(V, C.SENIOR, 0), C.model(V, C.JUNIOR, 1)
    _run(senior, junior, tok, 2, 8, True, 1)  # warm-up
    data = json.loads(JSON.read_text()) if JSON.exists() else {}
    data["setup"] = f"senior {C.SENIOR}, junior {C.JUNIOR}, vocab {V}, T=0.6, no EOS, min of repeats; {C.machine()}"

    if args.sweep in ("length", "both"):
        rows = []
        for n in [int(x) for x in args.lengths.split(",")]:
            rep = 2 if n <= 512 else 1
            row = {"tokens": n, "solo_s": _run(senior, junior, tok, args.length_batch, n, False, rep),
                   "tandem_s": _run(senior, junior, tok, args.length_batch, n, True, rep)}
            if n <= args.baseline_max:
                R.FAST_PATH = False
                try:
                    row["solo_generic_s"] = _run(senior, junior, tok, args.length_batch, n, False, 1)
                finally:
                    R.FAST_PATH = True
            rows.append(row)
            print(row, flush=True)
        data["length"] = {"batch": args.length_batch, "rows": rows}
        ns = [r["tokens"] for r in rows]
        k_solo = _fit_exponent(ns, [r["solo_s"] for r in rows])
        k_tan = _fit_exponent(ns, [r["tandem_s"] for r in rows])
        table = " / ".join(
            f"{r['tokens']}: solo {1e3 * r['solo_s'] / r['tokens']:.1f}, tandem {1e3 * r['tandem_s'] / r['tokens']:.1f}"
            + (f", generic {1e3 * r['solo_generic_s'] / r['tokens']:.1f}" if "solo_generic_s" in r else "")
            for r in rows)
        growth = rows[-1]["solo_s"] / rows[-1]["tokens"] / (rows[0]["solo_s"] / rows[0]["tokens"])
        C.record("S-length", f"rollout time ∝ T^k, B={args.length_batch} (k: solo, tandem)", None, "k ≈ 1",
                 f"k solo {k_solo:.2f}, tandem {k_tan:.2f}; ms per token step {table}; per-token time "
                 f"{ns[-1]} vs {ns[0]}: ×{growth:.2f}; table: scaling.md", met=None)
        data["length"].update(k_solo=k_solo, k_tandem=k_tan)

    if args.sweep in ("batch", "both"):
        rows = []
        for b in [int(x) for x in args.batches.split(",")]:
            rows.append({"batch": b, "solo_s": _run(senior, junior, tok, b, args.batch_tokens, False, 2),
                         "tandem_s": _run(senior, junior, tok, b, args.batch_tokens, True, 2)})
            print(rows[-1], flush=True)
        data["batch"] = {"tokens": args.batch_tokens, "rows": rows}
        table = " / ".join(f"B={r['batch']}: solo {r['batch'] * args.batch_tokens / r['solo_s']:.0f}, tandem "
                           f"{r['batch'] * args.batch_tokens / r['tandem_s']:.0f}" for r in rows)
        C.record("S-batch", f"rollout throughput vs batch, {args.batch_tokens} tokens (tokens/s)", None, None,
                 f"{table}; tandem ÷ solo time at B=1 {rows[0]['tandem_s'] / rows[0]['solo_s']:.2f}, at "
                 f"B={rows[-1]['batch']} {rows[-1]['tandem_s'] / rows[-1]['solo_s']:.2f}")

    JSON.write_text(json.dumps(data, indent=1))
    write_table(data)
    plot(data)


def write_table(data: dict) -> None:
    """``scaling.md``: the latest sweeps as markdown tables (rewritten each run; history is in RESULTS.md)."""
    out = ["# Rollout scaling (latest run)", "", data.get("setup", ""), "", "![scaling](scaling.png)", ""]
    if "length" in data:
        L = data["length"]
        out += [(f"## Length (B={L['batch']}): k = {L.get('k_solo', float('nan')):.2f} solo, "
                 f"{L.get('k_tandem', float('nan')):.2f} tandem (time ∝ T^k)"), "",
                "| new tokens | solo s | tandem s | solo ms/token | tandem ms/token | tandem ÷ solo | generic path ms/token |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in L["rows"]:
            g = f"{1e3 * r['solo_generic_s'] / r['tokens']:.2f}" if "solo_generic_s" in r else "—"
            out.append(f"| {r['tokens']} | {r['solo_s']:.2f} | {r['tandem_s']:.2f} | {1e3 * r['solo_s'] / r['tokens']:.2f} | "
                       f"{1e3 * r['tandem_s'] / r['tokens']:.2f} | {r['tandem_s'] / r['solo_s']:.2f} | {g} |")
        out.append("")
    if "batch" in data:
        Bt = data["batch"]
        out += [f"## Batch ({Bt['tokens']} new tokens)", "",
                "| batch | solo s | tandem s | solo tokens/s | tandem tokens/s | tandem ÷ solo |",
                "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in Bt["rows"]:
            n = r["batch"] * Bt["tokens"]
            out.append(f"| {r['batch']} | {r['solo_s']:.2f} | {r['tandem_s']:.2f} | {n / r['solo_s']:.0f} | "
                       f"{n / r['tandem_s']:.0f} | {r['tandem_s'] / r['solo_s']:.2f} |")
        out.append("")
    TABLE.write_text("\n".join(out))


def plot(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    if "length" in data:
        rows = data["length"]["rows"]
        n = [r["tokens"] for r in rows]
        ax = axes[0]
        ax.plot(n, [r["solo_s"] for r in rows], "o-", label=f"solo (k={data['length'].get('k_solo', float('nan')):.2f})")
        ax.plot(n, [r["tandem_s"] for r in rows], "s-", label=f"tandem (k={data['length'].get('k_tandem', float('nan')):.2f})")
        g = [r for r in rows if "solo_generic_s" in r]
        if g:
            ax.plot([r["tokens"] for r in g], [r["solo_generic_s"] for r in g], "x--", label="solo, generic path (before)")
        ax.set(xscale="log", yscale="log", xlabel="response tokens", ylabel="rollout time (s)",
               title=f"time vs length (B={data['length']['batch']})")
        ax.legend()
        ax = axes[1]
        ax.plot(n, [1e3 * r["solo_s"] / r["tokens"] for r in rows], "o-", label="solo")
        ax.plot(n, [1e3 * r["tandem_s"] / r["tokens"] for r in rows], "s-", label="tandem")
        if g:
            ax.plot([r["tokens"] for r in g], [1e3 * r["solo_generic_s"] / r["tokens"] for r in g], "x--",
                    label="solo, generic path (before)")
        ax.set(xscale="log", xlabel="response tokens", ylabel="ms per token step", ylim=(0, None),
               title="per-token time (flat = linear total)")
        ax.legend()
    if "batch" in data:
        rows = data["batch"]["rows"]
        b = [r["batch"] for r in rows]
        T = data["batch"]["tokens"]
        ax = axes[2]
        ax.plot(b, [x * T / r["solo_s"] for x, r in zip(b, rows)], "o-", label="solo")
        ax.plot(b, [x * T / r["tandem_s"] for x, r in zip(b, rows)], "s-", label="tandem")
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="generated tokens / s",
               title=f"throughput vs batch ({T} tokens)")
        ax.legend()
    from matplotlib.ticker import NullFormatter, NullLocator

    for ax, key, col in ((axes[0], "length", "tokens"), (axes[1], "length", "tokens"), (axes[2], "batch", "batch")):
        if key in data:
            ticks = [r[col] for r in data[key]["rows"]]
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xticks(ticks, [str(t) for t in ticks])
    fig.suptitle(data.get("setup", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(PNG, dpi=110)
    print(f"wrote {PNG}")


if __name__ == "__main__":
    main()
