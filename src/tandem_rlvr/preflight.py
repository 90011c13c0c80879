"""Checks of every cheaply checkable input before the first forward pass of ``train``, ``eval`` and ``demo``.

A typo in the second of three seniors, a benchmark file that is not there or an output directory
that cannot be written should stop a command in seconds, not after minutes of work on the inputs
that were fine. Each check reads configs and tokenizer files only (no weights) and raises the same
one-line errors the loaders raise.
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from tandem_rlvr.context import ContextPlan
from tandem_rlvr.errors import TandemError
from tandem_rlvr.models import WORLD_MODELS, ModelLoadError, check_tokenizers, load_tokenizer

log = logging.getLogger(__name__)

PROBE_PREFIX = ".write-check-"  # check_writable's scratch file; one stays where a kill cut the check short
PROBE_FILE = re.compile(rf"^{re.escape(PROBE_PREFIX)}[A-Za-z0-9_]+$")  # what a run, the demo and eval may find


def check_writable(directory: str | Path, what: str) -> None:
    """Create ``directory`` if needed and write (then remove) a scratch file in it."""
    d = Path(directory).expanduser()
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=d)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise TandemError(f"{what} {str(directory)!r} is not a writable directory: {e.strerror or e}") from None


def check_model(name: str, role: str, trust_remote_code: bool = False, revision: str | None = None):
    """The model's config is readable and its tokenizer loads (at ``revision``); returns the tokenizer (None for
    the world aliases)."""
    from transformers import AutoConfig

    from tandem_rlvr.models import check_exists, hub_kwargs, load_error_text

    if name in WORLD_MODELS:  # built (or found in the cache) by the command itself
        return None
    check_exists(name, role)
    path = str(Path(name).expanduser()) if Path(name).expanduser().exists() else name
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **hub_kwargs(name, revision, role))
    except Exception as e:  # transformers raises many types here
        raise ModelLoadError(f"could not read the {role} model config from {name!r}: {load_error_text(e, name)}") from None
    return load_tokenizer(name, trust_remote_code=trust_remote_code, role=role, revision=revision)


def check_eval(opts, juniors: dict[str, str], benches: dict | None = None) -> dict[str, int]:
    """``tandem-rlvr eval``: every senior and junior loads its config and tokenizer, reads the chains the
    evaluation writes (:func:`eval_context`), and the output directory is writable (pairs of different
    tokenizers are evaluated through the text bridge, so tokenizers need not agree). Returns each model's
    path -> the context its vLLM engine gets."""
    check_writable(opts.out, "eval --out")
    trc = opts.trust_remote_code
    roles = {path: f"junior {name!r}" if len(juniors) > 1 else "junior" for name, path in juniors.items()}
    roles.update({path: f"senior {name!r}" for name, path in opts.seniors.items()})
    toks = {path: check_model(path, role, trc) for path, role in roles.items()}  # every model exists, first
    seniors = set(opts.seniors.values())  # their tokenizers encode the prompts every pair samples
    bridged = _bridged_juniors(opts, juniors, toks)
    reads = _prompts_read(opts, toks, bridged)
    return {path: eval_context(opts, roles[path], path, tok, benches, senior=path in seniors, bridged=path in bridged,
                               prompt_tokenizers=reads[path])
            for path, tok in toks.items() if tok is not None and benches}


def _prompts_read(opts, toks: dict, bridged: set[str]) -> dict[str, list]:
    """Each model's path -> the tokenizers whose rendered prompts it reads: a senior its own; a junior of a senior's
    vocabulary that senior's (the pair samples the senior's prompt ids, in the senior's template, which may be
    longer than the junior's own); a bridged junior its own (the bridge renders the chains for it)."""
    stoks = {p: toks.get(p) for p in opts.seniors.values()}
    out = {}
    for path, tok in toks.items():
        if tok is None or path in bridged:
            out[path] = [tok]
            continue
        vocab = tok.get_vocab()
        shared = [t for p, t in stoks.items() if t is not None and p != path and t.get_vocab() == vocab]
        out[path] = ([tok] if path in stoks else []) + shared or [tok]
    return out


def _bridged_juniors(opts, juniors: dict[str, str], toks: dict) -> set[str]:
    """The juniors whose vocabulary differs from every senior's: each of their pairs runs through the text bridge,
    which reads a chain past the junior's context truncated from the left (docs/evaluation.md)."""
    stoks = [toks.get(p) for p in opts.seniors.values()]
    if any(t is None for t in stoks):  # a world alias: not read here
        return set()
    vocabs = [t.get_vocab() for t in stoks]  # as tandem_rlvr.engines.bridge.tokenizers_differ compares them
    return {p for p in juniors.values() if p not in opts.seniors.values() and toks.get(p) is not None
            and all(v != toks[p].get_vocab() for v in vocabs)}


def _check_prompts_fit(opts, role: str, tok, benches: dict, fitted: dict) -> None:
    """Every benchmark keeps at least one prompt within ``--context`` (``fitted``: benchmark -> the prompt ids that
    fit): else its evaluation would hold no chain, so stop before any weights load, with the shortest prompt."""
    from tandem_rlvr.data import encode_prompts
    from tandem_rlvr.errors import ConfigError

    for bname, (_, examples) in benches.items():
        if examples and not fitted[bname]:
            shortest = min(len(ids) for ids in encode_prompts(tok, examples)[1])
            raise ConfigError(f"eval --context {opts.context}: no prompt of benchmark {bname!r} fits on the {role}'s "
                              f"tokenizer (its shortest prompt is {shortest} tokens, and a chain needs one more): "
                              f"set --context > {shortest}")


def eval_context(opts, role: str, path: str, tok, benches: dict, *, senior: bool = False, bridged: bool = False,
                 prompt_tokenizers: list | None = None) -> int:
    """The context check of one evaluated model: it must read ``min(--context, longest prompt +
    --max-new-tokens)`` positions, the farthest the evaluation's chains reach (the prompts it reads, rendered by
    ``prompt_tokenizers``: default its own; a junior of a senior's vocabulary reads that senior's, within
    ``--context``); else a one-line error with the values that fit. Returns that reach.
    A ``senior`` must also keep a prompt of every benchmark within ``--context``; a ``bridged`` junior (another
    vocabulary than every senior's) is not held to the reach: the text bridge reads it the chains truncated from
    the left."""
    from transformers import AutoConfig

    from tandem_rlvr.context import model_context
    from tandem_rlvr.data import encode_prompts

    local = Path(path).expanduser()
    config = AutoConfig.from_pretrained(str(local) if local.exists() else path, trust_remote_code=opts.trust_remote_code)
    ctx = model_context(role, path, config, tok, opts.max_context)
    fitted = {b: encode_prompts(tok, ex, max_prompt_tokens=opts.context - 1, what=f"eval ({role})")[1]
              for b, (_, ex) in benches.items()}
    if senior:
        _check_prompts_fit(opts, role, tok, benches, fitted)
    lens = []
    for t in [t for t in prompt_tokenizers or [] if t is not None] or [tok]:  # the prompts it reads in its pairs
        lens += [len(ids) for prompts in fitted.values() for ids in prompts] if t is tok else [
            len(ids) for _, ex in benches.values()
            for ids in encode_prompts(t, ex, max_prompt_tokens=opts.context - 1, what=f"eval ({role})")[1]]
    longest = max(lens, default=0)
    reach = min(opts.context, longest + opts.max_new_tokens)
    if ctx.limit is None or reach <= ctx.limit:
        return reach
    if bridged:
        log.info("%s, the chains reach %d tokens: it reads them truncated from the left (the text bridge)",
                 ctx.describe(), reach)
        return reach
    fix = (f"set --max-new-tokens <= {ctx.limit - longest} or --context <= {ctx.limit}" if longest < ctx.limit else
           f"its prompts alone do not fit (the longest is {longest} tokens): set --context <= {ctx.limit} (longer "
           "prompts are then skipped)")
    raise TandemError(f"{ctx.describe()}, but the evaluation's chains reach {reach} tokens (its longest prompt "
                      f"{longest} + --max-new-tokens {opts.max_new_tokens}, at most --context {opts.context}): {fix}; "
                      "if the model reads more than its config says (rope scaling), set --max-context")


@dataclass(frozen=True)
class RunPlan:
    """What the checks before a training run read and measured, for :func:`~tandem_rlvr.training.build.build_run`
    to use instead of reading it again: the training ``examples`` (None: the caller supplies them), the
    tokenizers, and, where preflight could fit them (models and data both checked here), the prompts the run
    keeps: ``prompts[i]`` the ids of ``examples[prompt_example[i]]`` on the senior's tokenizer, ``context``
    the context check's outcome (prompts skipped there, each model's limit, the engines' length).
    ``val_examples``: the validation problems (None: no validation)."""

    examples: list | None = None
    tokenizer: object = None  # the senior's; None where not loaded here (a world alias, a pair the caller gives)
    junior_tokenizer: object = None  # the junior's, where it is another model
    prompt_example: list[int] | None = None
    prompts: list[list[int]] | None = None
    context: ContextPlan | None = None
    val_examples: list | None = None

    @property
    def fitted(self) -> bool:
        """Whether the prompts are fitted (else the builder fits them with the loaded models)."""
        return self.prompts is not None

    @property
    def too_long(self) -> int:
        """Training prompts skipped for ``rollout.max_prompt_tokens``; ``context.skipped`` counts those past a
        model's context."""
        if not self.fitted or self.examples is None:
            return 0
        return len(self.examples) - len(self.prompts) - self.context.skipped

    def __repr__(self) -> str:  # the counts, not every example and tokenizer
        n = lambda xs: "-" if xs is None else len(xs)  # noqa: E731
        skipped = f", {self.too_long} over max_prompt_tokens, {self.context.skipped} past a context" if self.fitted else ""
        return f"RunPlan({n(self.examples)} examples, {n(self.prompts)} prompts kept{skipped}, {n(self.val_examples)} validation)"


def check_train(cfg, *, models: bool = True, data: bool = True, reward: bool = True) -> RunPlan:
    """``tandem-rlvr train``: trackers, output directory, models (configs and tokenizers), tokenizer agreement,
    the context of every model, the reward function, and the training and validation data (each part unless
    the caller supplies it). Returns what it read as a :class:`RunPlan` (each file read once, each prompt
    tokenized once per tokenizer)."""
    from tandem_rlvr.data import train_examples, val_examples
    from tandem_rlvr.rewards import import_reward

    from tandem_rlvr.trackers import check_trackers

    check_trackers(cfg.train.trackers)
    check_writable(cfg.train.out_dir, "train.out_dir")
    m, d = cfg.model, cfg.data
    tok = jtok = None
    if models:
        tok = check_model(m.senior, "senior", m.trust_remote_code, m.revision)
        if not m.self_paired:
            jtok = check_model(m.junior, "junior", m.trust_remote_code, m.junior_revision)
            if tok is not None and jtok is not None and not m.bridge:
                check_tokenizers(tok, jtok, m.senior, m.junior)
    plan = RunPlan(tokenizer=tok, junior_tokenizer=jtok)
    if models and data and tok is not None and (m.self_paired or jtok is not None):
        plan = check_train_context(cfg, tok, jtok)
    if reward:
        import_reward(d.reward)
    if data and plan.examples is None:
        plan = replace(plan, examples=train_examples(cfg))
    if cfg.val.data and cfg.val.every:  # the very list the run's validation reads (build_run hands it on)
        plan = replace(plan, val_examples=val_examples(cfg, limit=cfg.val.limit or None))
    return plan


def train_contexts(cfg, tok, config, jtok=None, jconfig=None) -> list:
    """The :class:`~tandem_rlvr.context.ModelContext` of each model of a training run (the junior's only
    where it is another model: self-paired and LoRA-off juniors read as far as the senior)."""
    from tandem_rlvr.context import model_context

    m = cfg.model
    out = [model_context("senior", m.senior, config, tok, m.max_context)]
    if jconfig is not None and not m.self_paired:
        out.append(model_context("junior", str(m.junior), jconfig, jtok or tok, m.max_context))
    return out


def fit_train_prompts(cfg, examples, tok, contexts: list, jtok=None):
    """The training prompts a run keeps: within ``rollout.max_prompt_tokens`` and, with the whole response
    budget, within every model's context (:func:`tandem_rlvr.context.fit_context`; a junior with its own
    tokenizer measures the prompt in its own template). Returns ``(example indices, prompt ids, plan)``."""
    from tandem_rlvr.context import fit_context
    from tandem_rlvr.data import encode_prompt_texts, encode_prompts, render_prompt

    r = cfg.rollout
    keep, ids = encode_prompts(tok, examples, max_prompt_tokens=r.max_prompt_tokens, what="data (rollout.max_prompt_tokens)")
    if not ids:
        raise TandemError(f"no training prompt fits rollout.max_prompt_tokens={r.max_prompt_tokens}")
    lens = [len(x) for x in ids]
    models = [(contexts[0], lens)]
    for ctx in contexts[1:]:
        jl = lens if jtok is None else [len(e) for e in encode_prompt_texts(jtok, [render_prompt(jtok, examples[i].problem)
                                                                                    for i in keep])]
        models.append((ctx, jl))
    plan = fit_context(models, r.max_new_tokens, budget_key="rollout.max_new_tokens", prompt_key="rollout.max_prompt_tokens",
                       max_prompt_tokens=r.max_prompt_tokens, what="train")
    return [keep[i] for i in plan.keep], [ids[i] for i in plan.keep], plan


def _fitted(cfg, examples, tok, contexts: list, jtok, bridged) -> RunPlan:
    """The :class:`RunPlan` of ``examples`` fitted (:func:`fit_train_prompts`) on these tokenizers and contexts."""
    keep, ids, ctx = fit_train_prompts(cfg, examples, tok, contexts, jtok if bridged else None)
    return RunPlan(examples=examples, tokenizer=tok, junior_tokenizer=jtok, prompt_example=keep, prompts=ids, context=ctx)


def fit_pair_prompts(cfg, pair, examples) -> RunPlan:
    """:func:`fit_train_prompts` for a loaded pair: the :class:`RunPlan` of the prompts a run trains on, within
    rollout.max_prompt_tokens and every model's context."""
    contexts = train_contexts(cfg, pair.tokenizer, pair.senior.config, pair.junior_tokenizer,
                              getattr(pair.junior, "config", None))
    return _fitted(cfg, examples, pair.tokenizer, contexts, pair.junior_tokenizer, pair.junior_tokenizer is not None)


def check_train_context(cfg, tok, jtok, examples=None) -> RunPlan:
    """The context check of a training run before any weights load: configs, tokenizers and the whole
    training data (``examples``; None: read here) (see :mod:`tandem_rlvr.context`). Returns the fitted
    :class:`RunPlan`."""
    from transformers import AutoConfig

    from tandem_rlvr.data import train_examples

    m = cfg.model
    path = lambda name: str(Path(name).expanduser()) if Path(name).expanduser().exists() else name  # noqa: E731
    config = AutoConfig.from_pretrained(path(m.senior), trust_remote_code=m.trust_remote_code, revision=m.revision or None)
    jconfig = None if m.self_paired else AutoConfig.from_pretrained(path(m.junior), trust_remote_code=m.trust_remote_code,
                                                                    revision=m.junior_revision or None)
    examples = train_examples(cfg) if examples is None else examples
    return _fitted(cfg, examples, tok, train_contexts(cfg, tok, config, jtok, jconfig), jtok, m.bridge)


def check_demo(out_dir: str | Path, *, junior: str, seeds: int | None, workers: int | None,
               budget: int | None = None, kl_betas=None, world_seed: int | None = None) -> None:
    """``tandem-rlvr demo``: the output directory and the run's numbers, before the world is built."""
    check_writable(out_dir, "demo --out")
    if junior not in ("weak", "self"):  # weak: the world's junior; self: a frozen copy of the senior
        raise TandemError(f"demo junior must be weak or self, got {junior!r}")
    if seeds is not None and seeds < 1:
        raise TandemError(f"demo --seeds must be >= 1, got {seeds}")
    if workers is not None and workers < 1:
        raise TandemError(f"demo workers must be >= 1, got {workers}")
    if budget is not None and not _whole(budget, 1):
        raise TandemError(f"demo --budget must be a whole number of tokens >= 1, got {budget!r}")
    if world_seed is not None and not _whole(world_seed, 0):
        raise TandemError(f"demo --world-seed must be a whole number >= 0, got {world_seed!r}")
    bad = [b for b in (kl_betas or ()) if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf]
    if bad or (kl_betas is not None and len({f"{float(b):g}" for b in kl_betas}) != len(kl_betas)):  # one run name each
        raise TandemError(f"demo --kl-betas must be distinct numbers > 0, got {list(kl_betas)!r}")


def _whole(value, least: int) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
