"""The options of ``tandem-rlvr eval``: one typed dataclass, loaded as the training config is.

:func:`load_options` reads ``--config eval.yaml`` (a file or a shipped config's name) and the flags through
the training config's loader (:func:`tandem_rlvr.config.read_config_file`, :func:`tandem_rlvr.config.merge`):
the same YAML reading, the same coercion of each value to its field's type
(:mod:`tandem_rlvr.config_values`), the same allowed values declared beside each field and checked by
:func:`tandem_rlvr.config_bounds.check_fields`; flags win over the file, the file over the defaults. An option
the training config has too reuses that field's documentation, default and allowed values
(:func:`tandem_rlvr.config.reuse`), with the evaluation's own default where the paper's evaluation protocol sets one.

A file may spell a key with ``-`` or ``_`` and name a list by its flag (``senior``, ``junior``,
``benchmark``) or by its field (``seniors``, ...); ``no_curve: true`` is ``curve: false``. This module
imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tandem_rlvr.config import DTYPES, MAX_SEED, DataConfig, ModelConfig, RolloutConfig, help_line, merge, read_config_file, reuse
from tandem_rlvr.config_bounds import check_fields, default_of
from tandem_rlvr.config_bounds import option as _f
from tandem_rlvr.config_values import NamedPaths, coerce
from tandem_rlvr.data_keys import prompt_checks
from tandem_rlvr.engines.serving import ENGINES
from tandem_rlvr.errors import ConfigError
from tandem_rlvr.names import REWARD_KINDS

__all__ = ["FLAGS", "EvalOptions", "check_options", "describe", "eval_default", "field_doc", "load_options", "option_name"]


@dataclass
class EvalOptions:
    """The options of ``tandem-rlvr eval`` (flags, or the same keys in ``--config eval.yaml``), each documented
    once, here or in the training config field it reuses."""

    seniors: NamedPaths = _f({}, "Seniors to evaluate, name -> local path or hub name (--senior [NAME=]PATH, repeatable).")
    juniors: NamedPaths = _f({}, "Juniors, name -> local path or hub name (--junior [NAME=]PATH, repeatable; any tokenizer: a junior with another vocabulary runs through the text bridge); several give a seniors x juniors matrix.")
    benchmarks: list[str] = _f([], "Benchmark names (e.g. math500), local JSONL/JSON/CSV/parquet files, Hugging Face dataset ids or dataset directories (--benchmark, repeatable).")
    out: str = _f("eval_out", "Output directory: eval.json, eval.md, plots, chains/, parts/.")
    n: int = _f(8, "Samples per problem.", ge=1)
    max_new_tokens: int = reuse(RolloutConfig, "max_new_tokens")
    limit: int | None = _f(None, "First N problems of each benchmark (None = all; 0 would evaluate nothing).", ge=1)
    seed: int = _f(0, "Sampling seed.", ge=0, le=MAX_SEED)
    batch_size: int = _f(64, "Chains per generation call.", ge=1)
    reward: str = _f("math", "Reward function: math, gsm8k or boxed_exact.", choices=REWARD_KINDS)
    curve: bool = _f(True, "Run the word-handoff curve at curve_ps (--no-curve, or curve: false in the file, skips it: one run less per value).")
    curve_ps: list[float] = _f([1.0, 0.75, 0.5, 0.25], "P(senior) values of the word-handoff curve (comma-separated on the command line).", ge=0, le=1)
    temperature: float = reuse(RolloutConfig, "temperature", 0.7, ge=0, note="0 = greedy")
    top_p: float = reuse(RolloutConfig, "top_p", 0.8)
    top_k: int = reuse(RolloutConfig, "top_k", 20)
    max_rounds: int = _f(150, "Step-handoff chains stop after this many turns (the word-handoff curve has no turn limit).", ge=1)
    context: int = _f(4096, "Prompt + response token limit.", ge=2)
    max_context: int = _f(0, "As model.max_context: positions the models read (0 = each model's own limit); a senior or junior that cannot read the chains at --context and --max-new-tokens stops the evaluation before the first forward.", ge=0)
    split: str | None = _f(None, "Split of a named benchmark or a Hugging Face dataset.")
    subset: str = reuse(DataConfig, "subset")
    problem_key: str = reuse(DataConfig, "problem_key")
    answer_key: str = reuse(DataConfig, "answer_key")
    id_key: str | None = _f("id", "Id column of a local file (the row index where missing).")
    prompt_key: str = reuse(DataConfig, "prompt_key")
    prompt_template: str = reuse(DataConfig, "prompt_template")
    system_prompt: str = reuse(DataConfig, "system_prompt")
    chat_template_kwargs: dict = reuse(DataConfig, "chat_template_kwargs")
    trust_remote_code: bool = reuse(ModelConfig, "trust_remote_code")
    dtype: str = _f("auto", "auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16 or float16.", choices=("auto", *DTYPES))
    device: str = _f("auto", "auto, cpu, cuda, cuda:1, ... (a CUDA device needs one that torch sees).")
    reward_timeout_s: float = reuse(DataConfig, "reward_timeout_s")
    reward_workers: int = reuse(DataConfig, "reward_workers")
    chunk_tokens: int = _f(1024, "Tokens per vocabulary-sized scoring chunk.", ge=1)
    score_batch: int = _f(8, "Chains per teacher-forced scoring forward.", ge=1)
    progress: bool = _f(True, "Show progress bars (--no-progress: none, ours, transformers' or the Hub's).")
    overwrite: bool = _f(False, "Recompute finished (senior, benchmark) parts instead of reusing them.")
    engine: str = _f("hf", "Sampler of the chains: hf (in-process) or vllm (every chain, the word-handoff curve too, on one vLLM engine per senior that holds it and the junior; needs tandem-rlvr[vllm] and one vocabulary).", choices=ENGINES)
    mode: str = reuse(RolloutConfig, "mode")
    vllm_memory: float = reuse(RolloutConfig, "vllm_memory")

    def __post_init__(self) -> None:  # an EvalOptions built in code is checked as a loaded one
        check_fields(self, option_name)

    @property
    def junior(self) -> str:
        """The first junior's path (derived from :attr:`juniors`; '' when there is none)."""
        return next(iter(self.juniors.values()), "")


# The flag of each option whose flag is not --name-with-dashes (the others are); a file may use either name.
FLAGS = {"seniors": "--senior", "juniors": "--junior", "benchmarks": "--benchmark", "curve": "--no-curve",
         "progress": "--no-progress"}
_SPELLINGS = {"senior": "seniors", "junior": "juniors", "benchmark": "benchmarks"}


def option_name(name: str) -> str:
    """How an error names option ``name``: ``eval option 'top_p' (--top-p)``."""
    return f"eval option {name!r} ({FLAGS.get(name, '--' + name.replace('_', '-'))})"


def eval_default(name: str) -> Any:
    """The default of an evaluation option."""
    return default_of(next(f for f in dataclasses.fields(EvalOptions) if f.name == name))


def _spelled(data: dict, where: str) -> dict:
    """A file's (or the flags') keys as field names: ``-`` as ``_``, ``senior`` as ``seniors``, ``no_curve``."""
    out: dict = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "no_curve":
            name, value = "curve", not coerce(value, bool, option_name("curve"))
        name = _SPELLINGS.get(name, name)
        if name in out:
            raise ConfigError(f"{option_name(name)} is given twice in {where} ({key!r} and another spelling)")
        out[name] = value
    return out


def check_options(opts: EvalOptions) -> None:
    """Every option against the values its field declares, then the ones that read several: a senior, a junior
    and a benchmark, and the prompt keys as training checks them."""
    check_fields(opts, option_name)
    flag = lambda name: FLAGS.get(name, "--" + name.replace("_", "-"))  # noqa: E731
    for name, (given, key) in {"seniors": (opts.seniors, "senior"), "juniors": (opts.juniors, "junior"),
                               "benchmarks": (opts.benchmarks, "benchmark")}.items():
        if not given:
            raise ConfigError(f"eval needs {flag(name)} (or {key}: in the --config file)")
    for ok, name, why in prompt_checks(opts, flag):
        if not ok:
            raise ConfigError(f"{option_name(name)} {why}")
    _check_device(opts.device)


def _check_device(device: str) -> None:
    """``device`` names a device torch knows and, for CUDA, one it sees: a typo or a GPU flag on a machine
    without one stops here, not after the benchmarks and models have loaded (torch is imported only here)."""
    if device == "auto":
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{option_name('device')} must be auto, cpu, cuda or cuda:N (a torch device), "
                          f"got {device!r}") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            seen = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ConfigError(f"{option_name('device')} is {device!r}, but torch {torch.__version__} sees {seen}; "
                              "use --device cpu (or auto)")


def load_options(path: str | None = None, flags: dict | None = None) -> EvalOptions:
    """The checked :class:`EvalOptions` of ``--config`` ``path`` (a file or a shipped config's name, e.g.
    ``paper/eval``) and ``flags`` (field name -> value as typed; flags win), over the defaults."""
    opts = EvalOptions()
    if path is not None:
        data, _ = read_config_file(path, kind="eval", what="eval config file")
        merge(opts, _spelled(data, f"eval config file {path!r}"), option_name)
    if flags:
        merge(opts, _spelled(flags, "the flags"), option_name)
    check_options(opts)
    return opts


def describe() -> str:
    """The eval options with their defaults, documentation and allowed values (``tandem-rlvr config-help``)."""
    lines = ["tandem-rlvr eval options (flags --name-with-dashes, or keys of --config eval.yaml):"]
    return "\n".join(lines + [help_line(f"eval {f.name}", EvalOptions, f) for f in dataclasses.fields(EvalOptions)])


def field_doc(name: str) -> str:
    """The one documentation line of option ``name``."""
    return next(f for f in dataclasses.fields(EvalOptions) if f.name == name).metadata["doc"]
