"""``tandem-rlvr eval``: load the models and benchmarks, run :func:`~tandem_rlvr.evaluation.evaluate.evaluate_pair`
for every (senior, benchmark), and write ``eval.json``, ``eval.csv``, ``eval.md``, plots and the chains.

Options come from flags, from ``--config eval.yaml`` (the same keys, with ``_`` or ``-``), then
built-in defaults, in that order of precedence (:mod:`tandem_rlvr.evaluation.options`, loaded as the training
config is). Finished (senior, benchmark) parts are kept under
``OUT/parts/`` with a fingerprint of everything that determines them, so an interrupted run resumes
where it stopped (``--overwrite`` recomputes). What ``--out`` may hold, and its lock:
:mod:`tandem_rlvr.evaluation.outdir`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import logging
import time
from dataclasses import fields
from pathlib import Path

from tandem_rlvr.config_bounds import bounds_of
from tandem_rlvr.evaluation.options import FLAGS, EvalOptions, eval_default, field_doc, load_options
from tandem_rlvr.evaluation.outdir import slug

log = logging.getLogger(__name__)

_SWITCHES = {"curve": False, "progress": False, "trust_remote_code": True, "overwrite": True}  # flags without a value
_REPEATED = ("seniors", "juniors", "benchmarks")
_METAVARS = {"seniors": "[NAME=]PATH_OR_HUB", "juniors": "[NAME=]PATH_OR_HUB", "benchmarks": "NAME_OR_FILE"}


def _h(name: str) -> str:
    """A flag's help: the option's one documentation line (tandem_rlvr.evaluation.options.EvalOptions) and its
    default."""
    return field_doc(name) if name in _REPEATED else f"{field_doc(name)} (default {eval_default(name)})"


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """The flags of ``tandem-rlvr eval``, one per option (``--name-with-dashes``, or the flag of
    :data:`~tandem_rlvr.evaluation.options.FLAGS`); a value is read as a ``--config`` file's value is
    (:func:`~tandem_rlvr.evaluation.options.load_options`) and wins over it."""
    p.add_argument("--config", default=None,
                   help="YAML file with any of the keys below, or a shipped config's name (paper/eval; flags win)")
    for f in fields(EvalOptions):
        flag = FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        if f.name in _SWITCHES:
            p.add_argument(flag, dest=f.name, action="store_const", const=_SWITCHES[f.name], default=None, help=_h(f.name))
        else:
            words = bounds_of(f).choices if bounds_of(f) is not None else None  # shown; checked with the others
            p.add_argument(flag, dest=f.name, action="append" if f.name in _REPEATED else "store", default=None,
                           metavar=_METAVARS.get(f.name) or (f"{{{','.join(words)}}}" if words else None), help=_h(f.name))


def flag_values(args: argparse.Namespace) -> dict:
    """The options given as flags (field name -> value as typed)."""
    return {f.name: getattr(args, f.name) for f in fields(EvalOptions) if getattr(args, f.name, None) is not None}


def resolve_options(args: argparse.Namespace) -> EvalOptions:
    """The options of ``tandem-rlvr eval``: flags > ``--config`` file > defaults, checked."""
    return load_options(getattr(args, "config", None), flag_values(args))


# ---------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------


def pair_label(senior: str, junior: str, many_juniors: bool) -> str:
    """The label of an evaluated pair: ``SENIOR+JUNIOR`` with several juniors, else the senior's name. It names the
    pair's files: ``chains/<label>/`` and ``parts/<label>__<benchmark>.json`` (:func:`slug` of each)."""
    return f"{senior}+{junior}" if many_juniors else senior


def benchmark_names(opts: EvalOptions) -> list[tuple[str, str]]:
    """``(name, source)`` of each ``--benchmark``: a file's stem, else the source as given; ``_2``, ``_3``, ...
    after a name taken."""
    out: list[tuple[str, str]] = []
    taken: set[str] = set()
    for src in opts.benchmarks:
        name = Path(src).stem if Path(src).expanduser().is_file() else src
        key, i = name, 2
        while key in taken:
            key, i = f"{name}_{i}", i + 1
        taken.add(key)
        out.append((key, src))
    return out


def check_file_names(opts: EvalOptions) -> None:
    """Two pairs or two benchmarks whose names make the same file name would write each other's chains and parts
    (``a b`` and ``a_b``; ``x+y`` with junior ``z`` and ``x`` with junior ``y+z``): refused, naming both, before
    anything is read."""
    from tandem_rlvr.errors import ConfigError

    many = len(opts.juniors) > 1
    labels = [pair_label(s, j, many) for j in opts.juniors for s in opts.seniors]
    benches = [k for k, _ in benchmark_names(opts)]
    files = [(f"parts/{slug(a)}__{slug(b)}.json", f"{a!r} on {b!r}") for a in labels for b in benches]
    for what, names in (("seniors" if not many else "pairs", [(f"chains/{slug(x)}/", repr(x)) for x in labels]),
                        ("benchmarks", [(f"chains/*/{slug(x)}.jsonl", repr(x)) for x in benches]),
                        ("evaluations", files)):
        seen: dict[str, str] = {}
        for file, name in names:
            if file in seen:
                raise ConfigError(f"eval: {what} {seen[file]} and {name} would write the same files ({file}: a "
                                  "file name keeps letters, digits, '.', '_' and '-' only); give one another name")
            seen[file] = name


def _stamp(path: str) -> list:
    p = Path(path).expanduser()
    if p.is_dir():
        return sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in p.iterdir() if f.is_file())
    return [path]


_PROMPT_KEYS = ("subset", "prompt_key", "prompt_template", "system_prompt", "chat_template_kwargs")


def _fingerprint_fields(opts: EvalOptions, senior_path: str, source: str, examples,
                       junior_path: str | None = None) -> dict:
    """Everything that determines a (senior, benchmark) part, as the JSON a part keeps (``inputs``), so a part
    computed with other options can be told apart by field."""
    keys = ("n", "max_new_tokens", "seed", "batch_size", "reward", "curve_ps", "temperature", "top_p", "top_k",
            "max_rounds", "context", "dtype", "device", "engine")  # not mode: both give the same chains
    blob = {k: getattr(opts, k) for k in keys}
    blob["curve_ps"] = opts.curve_ps if opts.curve else []
    prompt = {k: getattr(opts, k) for k in _PROMPT_KEYS if getattr(opts, k) != eval_default(k)}
    if prompt:  # only where set: the parts of a run with the paper's prompt keep their fingerprints
        blob["prompt"] = prompt
    if opts.reward_timeout_s != eval_default("reward_timeout_s"):  # a timed-out check scores 0
        blob["reward_timeout_s"] = opts.reward_timeout_s
    junior_path = junior_path or opts.junior
    blob.update(senior=[senior_path, _stamp(senior_path)], junior=[junior_path, _stamp(junior_path)], source=source,
                audit=2,  # 2: bits-per-byte legibility and cross-tokenizer pairs
                data=hashlib.sha256(json.dumps([[str(e.id), e.problem, str(e.answer)] for e in examples]).encode()).hexdigest())
    return json.loads(json.dumps(blob, default=str))  # as a part file holds it (tuples as lists)


def _hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _fingerprint(opts: EvalOptions, senior_path: str, source: str, examples, junior_path: str | None = None) -> str:
    return _hash(_fingerprint_fields(opts, senior_path, source, examples, junior_path))


# how a refusal names a fingerprint field that is no option of its own
_FIELD_NAMES = {"curve_ps": "--curve-ps/--no-curve", "prompt": "the prompt keys", "source": "the benchmark source",
                "data": "the benchmark's problems", "audit": "the evaluation's version"}


def _changed(saved: dict, fields: dict) -> list[str]:
    """How a part's saved fingerprint fields ``saved`` and this run's ``fields`` differ, each named as its flag,
    with both values where they are short (``--n 4 -> 1``)."""
    out = []
    for key in [*fields, *(k for k in saved if k not in fields)]:
        old, new = saved.get(key), fields.get(key)
        if old == new:
            continue
        if key in ("senior", "junior"):  # [path, the files' names, sizes and times]
            paths = [v[0] if isinstance(v, list) and v else None for v in (old, new)]
            out.append(f"the {key} {paths[0]} -> {paths[1]}" if paths[0] != paths[1] else
                       f"the {key}'s files (changed in {paths[1]} since)")
            continue
        name = _FIELD_NAMES.get(key) or FLAGS.get(key, "--" + key.replace("_", "-"))
        short = all(len(str(v)) <= 40 for v in (old, new))
        out.append(f"{name} {old} -> {new}" if short and key not in ("data", "audit") else name)
    return out


def _part_path(out: Path, label: str, bench: str) -> Path:
    """The finished part of one (pair label, benchmark) under ``--out``."""
    return out / "parts" / f"{slug(label)}__{slug(bench)}.json"


def _read_part(part: Path) -> dict:
    """A part file's object ({} where it is no JSON object)."""
    try:
        saved = json.loads(part.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _stale_parts(opts: EvalOptions, benches: dict):
    """``(part, its saved fields or None, this run's fields)`` of every finished part under ``--out`` that this
    run would compute with another fingerprint."""
    many = len(opts.juniors) > 1
    for jname, jpath in opts.juniors.items():
        for name, path in opts.seniors.items():
            for bname, (src, examples) in benches.items():
                part = _part_path(Path(opts.out), pair_label(name, jname, many), bname)
                if not part.is_file():
                    continue
                fields, saved = _fingerprint_fields(opts, path, src, examples, jpath), _read_part(part)
                if saved.get("fingerprint") != _hash(fields):
                    inputs = saved.get("inputs")
                    yield part, inputs if isinstance(inputs, dict) else None, fields


def check_finished_parts(opts: EvalOptions, benches: dict) -> None:
    """Refuse, before any model loads, to replace a finished part under ``--out`` that another evaluation
    (other options, models or problems) computed: one line naming the part and what differs, and that
    ``--overwrite`` recomputes it (or another ``--out`` keeps both). Parts of this run's fingerprint are reused."""
    from tandem_rlvr.errors import ConfigError

    if opts.overwrite:
        return
    stale = list(_stale_parts(opts, benches))
    if not stale:
        return
    (part, saved, fields), more = stale[0], f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
    what = ("was computed with other options, models or problems (it records no option: an older version's)"
            if saved is None else "was computed with other inputs: " + "; ".join(_changed(saved, fields)))
    raise ConfigError(f"eval --out {opts.out}: the finished part {part.relative_to(opts.out)}{more} {what}; pass "
                      "--overwrite to recompute it (replacing it), or give another --out")


# ---------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------


def _device_dtype(opts: EvalOptions):
    import torch

    device = opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = opts.dtype if opts.dtype != "auto" else ("bfloat16" if str(device).startswith("cuda") else "float32")
    return torch.device(device), dtype


def _load_benchmarks(opts: EvalOptions, skipped: dict | None = None) -> dict[str, tuple[str, list]]:
    """``{name: (source, problems)}`` of every ``--benchmark``; ``skipped`` (where given) gets ``{name: {reason:
    rows}}``: the rows its loader dropped (no answer, an empty problem, ...; all of the source's, before --limit)."""
    from collections import Counter

    from tandem_rlvr.data import load_examples
    from tandem_rlvr.prompts import PromptFormat

    fmt = PromptFormat.of(opts.prompt_template, opts.system_prompt, opts.chat_template_kwargs)  # as training's
    out: dict[str, tuple[str, list]] = {}
    for key, src in benchmark_names(opts):
        counts: Counter = Counter()
        ex = load_examples(src, opts.split, problem_key=opts.problem_key, answer_key=opts.answer_key,
                           id_key=opts.id_key, limit=opts.limit, subset=opts.subset, prompt_key=opts.prompt_key,
                           prompt_format=fmt, key="eval --benchmark", skipped=counts)
        _check_unique_ids(src, ex, opts.id_key)
        out[key] = (src, list(ex))
        if skipped is not None:
            skipped[key] = dict(sorted(counts.items()))
        log.info("benchmark %s: %d problems from %s", key, len(out[key][1]), src)
    return out


def _check_unique_ids(src: str, examples, id_key: str | None) -> None:
    """Every problem of a benchmark has its own id: the chains, the legibility scores and the chain browser find
    a problem by its id, so a shared one would mix two problems' chains."""
    from collections import Counter

    from tandem_rlvr.errors import DataError

    dup = [i for i, n in Counter(str(e.id) for e in examples).items() if n > 1]
    if dup:
        raise DataError(f"eval --benchmark {src!r}: {len(dup)} problem id(s) appear more than once ({dup[0]!r} first; "
                        f"id column {id_key!r}, --id-key); every problem needs its own id")


def _engine_spec(opts: EvalOptions, path: str, junior_path: str, dtype: str, max_model_len: int | None = None):
    """The rollout engine of a senior and the junior: in-process in ``--mode``, or (``--engine vllm``) the dual vLLM
    engine of ``max_model_len`` positions: the farthest the chains reach (preflight's context check), else --context."""
    from tandem_rlvr.engines.spec import EngineSpec

    # what evaluate_pair samples: solo, handoff, the curve
    return EngineSpec(kind=opts.engine, schedules=("none", "alternate", "word"), mode=opts.mode, senior_path=path,
                      junior_path=junior_path, dtype=dtype, memory=opts.vllm_memory, seed=opts.seed,
                      max_model_len=max_model_len or opts.context, trust_remote_code=opts.trust_remote_code,
                      long_context=bool(opts.max_context))


def _engine(opts: EvalOptions, path: str, junior_path: str, dtype: str, tok, senior, junior, max_model_len=None,
            junior_tok=None):
    """The rollout engine of one senior (:func:`_engine_spec`, built by the one constructor); each model's tokens
    end a chain on its own EOS."""
    from tandem_rlvr.engines.factory import build_engine
    from tandem_rlvr.models import eos_ids, junior_eos_ids

    return build_engine(_engine_spec(opts, path, junior_path, dtype, max_model_len), senior, junior,
                        eos_token_ids=eos_ids(tok, senior), pad_token_id=tok.pad_token_id,
                        junior_eos_token_ids=junior_eos_ids(tok, senior, junior, junior_tok))


def _load_senior(opts: EvalOptions, name: str, path: str, tok, junior, junior_tok, junior_name: str,
                 junior_path: str | None, reach: dict | None, rows: contextlib.ExitStack):
    """Load a senior for ``junior``: ``(senior, engine, cut)``. With one tokenizer but output layers of different
    sizes, the larger is cut to the shared rows until ``rows`` closes (``cut`` says what was cut, else None); the
    engine is built where the two share a vocabulary, else None (the text bridge)."""
    from tandem_rlvr.config import ConfigError
    from tandem_rlvr.evaluation.crosstok import same_vocabulary, shared_output_rows
    from tandem_rlvr.models import check_output_rows, freeze, load_causal_lm

    device, dtype = _device_dtype(opts)
    senior = freeze(load_causal_lm(path, dtype=dtype, trust_remote_code=opts.trust_remote_code,
                                   role=f"senior {name!r}")).to(device)
    check_output_rows(senior, tok, path, f"senior {name!r}")
    cut = rows.enter_context(shared_output_rows(senior, junior, tok, junior_tok))
    if cut and opts.engine == "vllm":
        raise ConfigError(f"eval: --engine vllm needs output layers of one size; senior {name!r} and junior "
                          f"{junior_name!r} share a tokenizer but not that ({cut}): use --engine hf")
    if same_vocabulary(senior, junior, tok, junior_tok):
        engine = _engine(opts, path, junior_path or opts.junior, dtype, tok, senior, junior, (reach or {}).get(path),
                         junior_tok)
        return senior, engine, cut
    if opts.engine == "vllm":
        raise ConfigError(f"eval: --engine vllm needs a senior and junior with one vocabulary; senior {name!r} "
                          f"and junior {junior_name!r} differ (use --engine hf: the text bridge)")
    return senior, None, cut


def _eval_senior(opts: EvalOptions, name: str, path: str, junior, junior_tok, benches: dict, scorer,
                 junior_name: str = "junior", junior_path: str | None = None, label: str | None = None,
                 reach: dict | None = None, settings=None, load_skips: dict | None = None) -> dict:
    """Every benchmark of one (senior, junior) with the run's ``settings`` (:class:`EvalSettings`, built once from
    ``opts``); a finished part with the same fingerprint is reused. ``load_skips``: each benchmark's rows dropped
    while loading, by reason (:func:`_load_benchmarks`), reported as its ``n_skipped_at_load``."""
    from tandem_rlvr.evaluation.crosstok import evaluate_any_pair, template_kind
    from tandem_rlvr.evaluation.evaluate import EvalSettings
    from tandem_rlvr.evaluation.outdir import remove_stale_temps
    from tandem_rlvr.io import AtomicJsonl, atomic_write_json
    from tandem_rlvr.evaluation.metrics import macro_average
    from tandem_rlvr.models import load_tokenizer

    out = Path(opts.out)
    tok = load_tokenizer(path, trust_remote_code=opts.trust_remote_code, role=f"senior {name!r}")
    senior, engine, cut, per, label = None, None, None, {}, label or name
    rows = contextlib.ExitStack()  # the junior, shared by every senior, gets its own output layer back at the end
    try:
        for bname, (src, examples) in benches.items():
            inputs = _fingerprint_fields(opts, path, src, examples, junior_path)
            fp = _hash(inputs)
            part = _part_path(out, label, bname)
            chains = out / "chains" / slug(label) / f"{slug(bname)}.jsonl"
            if not opts.overwrite and part.is_file() and chains.is_file():
                saved = _read_part(part)
                if saved.get("fingerprint") == fp:
                    log.info("reusing finished %s / %s from %s", name, bname, part)
                    per[bname] = saved["metrics"]
                    continue
            if senior is None:
                senior, engine, cut = _load_senior(opts, name, path, tok, junior, junior_tok, junior_name, junior_path,
                                                   reach, rows)
            t0 = time.perf_counter()
            for stale in (chains, part):  # a killed run's half-written temporaries: not resumed, never read
                remove_stale_temps(stale)
            with AtomicJsonl(chains) as sink:
                metrics, _ = evaluate_any_pair(senior, junior, tok, junior_tok, examples, settings or EvalSettings.of(opts),
                                               scorer=scorer, sink=sink.write, keep_chains=False, engine=engine,
                                               labels={"senior": name, "junior": junior_name, "benchmark": bname})
            metrics["time_s"] = time.perf_counter() - t0
            if cut:
                metrics["output_rows"] = cut
            atomic_write_json(part, {"fingerprint": fp, "inputs": inputs, "metrics": metrics})
            per[bname] = metrics
    finally:  # a vLLM engine holds its --vllm-memory share until shut down: the next senior's could not start
        if engine is not None:
            engine.close()
        rows.close()
        del senior, engine
        gc.collect()
    for bname, metrics in per.items():
        metrics["n_skipped_at_load"] = dict((load_skips or {}).get(bname, {}))
    return {"per_benchmark": per, "macro": macro_average(per), "junior": junior_name,
            "templates": {"senior": template_kind(tok), "junior": template_kind(junior_tok)}}


PROMPT_KEYS = ("prompt_template", "system_prompt", "chat_template_kwargs", "prompt_key")


def _warn_other_prompt(opts: EvalOptions, name: str, path: str) -> None:
    """A senior saved by a run (``final/``, ``best/`` or a checkpoint, its run's ``config.yaml`` one or two folders
    up) that trained on other prompts than this evaluation renders: one warning naming the keys (a senior trained
    with a system prompt or template is evaluated with the same options: ``--system-prompt``, ...)."""
    import yaml

    local = Path(path).expanduser()
    if not local.is_dir():
        return
    for up in local.resolve().parents[:2]:
        cfg = up / "config.yaml"
        if not cfg.is_file():
            continue
        try:
            data = (yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}).get("data") or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
            return
        differ = [k for k in PROMPT_KEYS if k in data and (data[k] or None) != (getattr(opts, k) or None)]
        if differ:
            log.warning("senior %r was trained with other prompts than this evaluation renders (%s in %s differ "
                        "from the eval options): pass the same --%s to evaluate it on its own prompts", name,
                        ", ".join(f"data.{k}" for k in differ), cfg, " / --".join(k.replace("_", "-") for k in differ))
        return


def run_eval(opts: EvalOptions) -> dict:
    """Run a whole evaluation; returns the ``eval.json`` object (also written with the other outputs)."""
    from tandem_rlvr import preflight
    from tandem_rlvr.evaluation import outdir
    from tandem_rlvr.evaluation.outputs import write_outputs

    check_file_names(opts)
    names = dict(benchmark_names(opts))
    outdir.check_out(opts, names)  # a file, files no evaluation wrote, another evaluation: before anything is written
    load_skips: dict = {}
    benches = _load_benchmarks(opts, load_skips)
    check_finished_parts(opts, benches)  # no finished result is replaced without --overwrite
    # every model's config, tokenizer and context, the output directory: before any forward pass
    reach = preflight.check_eval(opts, opts.juniors, benches)
    for name, path in opts.seniors.items():
        _warn_other_prompt(opts, name, path)
    with outdir.writing(opts, names, lambda: check_finished_parts(opts, benches)) as out:  # run.lock held
        t0 = time.perf_counter()
        results, pairs = _evaluate_pairs(opts, benches, reach, load_skips)
        return write_outputs(opts, out, benches, results, pairs, time.perf_counter() - t0)


def _evaluate_pairs(opts: EvalOptions, benches: dict, reach: dict, load_skips: dict) -> tuple[dict, dict]:
    """Every senior with every junior on every benchmark: ``({label: result}, {label: (senior, junior)})``."""
    from tandem_rlvr.evaluation.evaluate import EvalSettings, open_scorer
    from tandem_rlvr.models import check_output_rows, freeze, load_causal_lm, load_tokenizer

    device, dtype = _device_dtype(opts)
    juniors = opts.juniors
    settings = EvalSettings.of(opts)  # what every pair and mode reads
    results, pairs = {}, {}
    with open_scorer(opts.reward, opts.reward_timeout_s, opts.reward_workers) as scorer:
        for jname, jpath in juniors.items():
            trc, role = opts.trust_remote_code, f"junior {jname!r}" if len(juniors) > 1 else "junior"
            junior_tok = load_tokenizer(jpath, trust_remote_code=trc, role=role)
            junior = freeze(load_causal_lm(jpath, dtype=dtype, trust_remote_code=trc, role=role)).to(device)
            check_output_rows(junior, junior_tok, jpath, role)
            for name, path in opts.seniors.items():
                label = pair_label(name, jname, len(juniors) > 1)
                results[label] = _eval_senior(opts, name, path, junior, junior_tok, benches, scorer, jname, jpath,
                                              label, reach, settings, load_skips)
                pairs[label] = (name, jname)
            del junior
            gc.collect()
    return results, pairs


def run_from_args(args: argparse.Namespace) -> int:
    """``tandem-rlvr eval``: resolve the options, run, print the headline table."""
    from tandem_rlvr.evaluation.report import seniors_table
    from tandem_rlvr.logs import quiet_libraries

    opts = resolve_options(args)
    quiet_libraries(downloads=None if opts.progress else False)  # transformers' bars always off; --no-progress: all
    obj = run_eval(opts)
    results = obj.get("pairs") or obj.get("seniors") or {obj["senior"]: obj}
    print(seniors_table(results))
    print(f"wrote {Path(opts.out) / 'eval.json'}, eval.csv, eval.md, eval.html, plots and chains/ under {opts.out}")
    return 0
