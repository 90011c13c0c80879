"""One typed configuration for training: YAML files plus dotted ``key=value`` overrides.

Every field is documented once, here, in its ``doc`` metadata (``tandem-rlvr config-help`` prints
them). Unknown keys and wrong types are rejected with the key's dotted name; cross-field checks run
at load time; the resolved config is written to the run directory. This module knows nothing of torch.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tandem_rlvr.errors import ConfigError  # noqa: F401 (raised here; also importable from here)

ARMS = ("trlvr", "grpo", "kl_reg")



def _f(default: Any, doc: str, **kw) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc}, **kw)
    return field(default=default, metadata={"doc": doc}, **kw)


@dataclass
class ModelConfig:
    senior: str = _f("", "Senior (trained) model: a local directory or a Hugging Face hub name.")
    junior: str | None = _f(None, "Junior (frozen) model: local directory or hub name. Unused when self_paired.")
    self_paired: bool = _f(False, "Junior = frozen copy of the senior's starting weights (the paper's main setting).")
    trust_remote_code: bool = _f(False, "Allow model code from the checkpoint to run. Off unless you ask.")
    bridge: bool = _f(False, "Junior with a different tokenizer: co-write through text, re-encoding each turn (trlvr with handoff step or alternate only).")
    dtype: str = _f("float32", "Weights dtype: float32, bfloat16 or float16.")
    junior_dtype: str = _f("", "Weights dtype of the frozen junior in the trainer (its log-probs): float32, bfloat16 or float16; empty = model.dtype. The paper configs keep it in bfloat16 (8 instead of 16 GB of a 4B model per GPU).")
    lora_r: int = _f(0, "LoRA rank for the senior (0 = full fine-tuning). With self_paired, the junior is the base with the adapter off.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_targets: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "Module names LoRA adapts.")
    max_context: int = _f(0, "Positions the models read (0 = each model's own: max_position_embeddings, with a declared linear/dynamic/yarn rope factor, else the tokenizer's model_max_length). Prompts that do not fit with the whole response budget are skipped and counted; a budget that fits no prompt stops the run before the first forward. Set it only for a model that reads more than its config says (rope scaling): the run goes on with a warning.")


@dataclass
class AlgoConfig:
    arm: str = _f("trlvr", "trlvr (tandem rollouts, senior-token loss), grpo (solo, all tokens) or kl_reg (solo + beta*k3 KL to the junior).")
    group_size: int = _f(8, "Rollouts per prompt (G).")
    loss_type: str = _f("grpo", "Aggregation: grpo (per-sequence mean, then batch mean), dapo (token mean over the step's tokens) or dr_grpo (sum / (B*max_len)).")
    normalize_std: bool = _f(True, "Divide advantages by the group std (False = Dr. GRPO).")
    kl_beta: float = _f(0.0, "Weight of the k3 KL(senior || junior) term; > 0 required for kl_reg, 0 for the others.")
    clip_eps: float = _f(0.2, "PPO clip epsilon (lower side; the upper side too unless clip_eps_high is set).")
    clip_eps_high: float | None = _f(None, "Upper clip epsilon (DAPO clip-higher); None = clip_eps.")
    lr: float = _f(1e-6, "AdamW learning rate.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    max_grad_norm: float = _f(1.0, "Gradient-norm clip (0 = off).")
    warmup_steps: int = _f(0, "Linear LR warm-up steps (constant afterwards).")
    mini_batch_prompts: int = _f(0, "Prompts per PPO mini-batch (one optimizer update each); 0 = all of the step's prompts (one update per step and epoch).")
    ppo_epochs: int = _f(1, "Passes over each step's rollouts.")
    micro_batch: int = _f(0, "Rollouts per forward/backward chunk (gradient accumulation); 0 = whole mini-batch.")
    senior_frac_band: list | None = _f(None, "Optional [low, high] band on a trlvr step's senior token share; outside it the run stops. None = no band (every step's ownership mask is still checked against the schedule's record, and its coins against handoff.p).")


@dataclass
class HandoffConfig:
    schedule: str = _f("word", "word, bernoulli, step, alternate, chunk or none (used by the trlvr arm; grpo/kl_reg roll out solo).")
    p: float = _f(0.5, "P(senior) of each handoff coin.")
    max_gap: int = _f(32, "Word schedule: redraw the author after K tokens without a word boundary.")
    chunk_size: int = _f(16, "Chunk schedule: redraw every N tokens.")


@dataclass
class RolloutConfig:
    max_new_tokens: int = _f(3000, "Response budget shared by both authors.")
    max_prompt_tokens: int = _f(1024, "Longer prompts are skipped and counted.")
    temperature: float = _f(0.6, "Sampling temperature of both models.")
    top_p: float = _f(1.0, "Nucleus sampling threshold.")
    top_k: int = _f(0, "Top-k sampling (0 = off).")
    batch_size: int = _f(0, "Rollouts per engine call (0 = all of this process's rollouts of the step at once). A multiple of group_size.")
    engine: str = _f("hf", "Rollout engine: hf (in-process, every schedule) or vllm (every schedule; tandem rollouts on one vLLM engine that holds both models and decodes each rollout as one request, solo arms on a plain vLLM engine of the senior; needs tandem-rlvr[vllm]). A junior with another tokenizer (model.bridge) always uses the text bridge (step/alternate).")
    mode: str = _f("lockstep", "How the in-process engine keeps both models in step (same tokens, owners and log-probs on the same seed): lockstep (both models read every token: one forward each per token) or catchup (a model runs only when it writes, then reads the tokens it missed in one forward; wins with small batches and long turns).")
    vllm_memory: float = _f(0.3, "Share of the accelerator's memory the vLLM engine may take (in training it shares the device with the update).")
    vllm_timeout_s: float = _f(600.0, "Stop the run (the last checkpoint is kept) when a vLLM rollout or weight push does not finish within this many seconds.")
    vllm_dtype: str = _f("model", "Weights dtype of the vLLM engine: model (= model.dtype), bfloat16, float16 or float32. The paper configs train float32 master weights and decode in bfloat16; each push casts the senior's weights.")
    vllm_sleep: str = _f("off", "What the vLLM engine gives back to training between its rollouts (vLLM sleep mode, GPUs only): off (keeps everything), kv (releases its KV cache during the update) or weights (also moves its weights to host memory; they come back before the push). Accepted and ignored on a CPU (one log line).")


@dataclass
class TrainConfig:
    steps: int = _f(200, "Training steps (each: prompts_per_step prompts x group_size rollouts).")
    prompts_per_step: int = _f(16, "Prompts per step.")
    save_every: int = _f(50, "Checkpoint every N steps (0 = only final).")
    keep_last: int = _f(3, "Checkpoints kept (older ones are deleted).")
    seed: int = _f(0, "Seed for data order, sampling and handoff coins.")
    out_dir: str = _f("runs/trlvr", "Run directory: config.yaml, metrics.jsonl, checkpoints/, final/.")
    max_nonfinite: int = _f(3, "Stop (with a checkpoint) after this many non-finite updates in a row.")
    trackers: list = _f([], "Extra accelerate trackers, e.g. [tensorboard] or [wandb].")
    progress: bool = _f(True, "Show a progress bar.")
    preempt_exit_code: int = _f(143, "Exit code after SIGTERM/SIGUSR1/SIGINT stopped the run with a checkpoint (a requeue script tells it from a failure; 143 = 128 + SIGTERM).")
    watchdog_s: float = _f(1800.0, "Stop with a stack dump of every thread (exit 124) when a step makes no progress for this many seconds (0 = off).")
    collective_timeout_s: float = _f(1800.0, "Multi-process: a collective waiting longer than this for a peer fails, and the run stops naming the vanished rank (exit 75).")
    fsdp: str = _f("off", "Shard the senior over the processes with FSDP2: off (DDP, a full copy each), full (parameters, gradients, AdamW states sharded; like ZeRO-3) or zero2 (gradients and AdamW states; like ZeRO-2). Needs a multi-process launch.")


@dataclass
class DataConfig:
    train: str = _f("deepscaler", "Training data: a benchmark name (docs/rewards-and-data.md), world/train, or a local JSONL/JSON/CSV/parquet file.")
    train_split: str | None = _f(None, "Split of a named benchmark (default: its training split).")
    problem_key: str = _f("problem", "Problem column of a local file.")
    answer_key: str = _f("answer", "Answer column of a local file.")
    reward: str = _f("math", "Reward: math (math-verify on the last \\boxed{}), gsm8k, boxed_exact, or your own plain function as package.module:function (run in-process, no time limit).")
    reward_timeout_s: float = _f(2.0, "Hard time limit of one answer check.")
    reward_workers: int = _f(2, "Worker processes for answer checking.")


@dataclass
class ValConfig:
    data: str | None = _f(None, "Validation data (name or file); None = no validation.")
    split: str | None = _f(None, "Split of a named benchmark, e.g. val for deepscaler's 1,000 held-out problems.")
    every: int = _f(0, "Validate every N steps (0 = off).")
    n: int = _f(4, "Samples per validation problem.")
    limit: int = _f(64, "Validation problems used (0 = all).")
    max_new_tokens: int = _f(0, "Validation budget (0 = rollout.max_new_tokens).")
    select: str = _f("pass@1", "The validation metric whose best value picks best/: pass@K with K <= val.n (the paper's authors: pass@4 of 4 samples per problem). best/best.json records the metric, its value and the step.")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    handoff: HandoffConfig = field(default_factory=HandoffConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    val: ValConfig = field(default_factory=ValConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def mini_batch_prompts(self) -> int:
        """Prompts per PPO mini-batch (``algo.mini_batch_prompts``, 0 = all of the step's)."""
        return self.algo.mini_batch_prompts or self.train.prompts_per_step

    def senior_band(self) -> tuple[float, float] | None:
        """The allowed senior-token fraction of a trlvr step (None: no band)."""
        if self.algo.senior_frac_band is None:
            return None
        lo, hi = self.algo.senior_frac_band
        return float(lo), float(hi)


_SAME = object()


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _reuse(section: type, name: str, default: Any = _SAME) -> Any:
    """The training config's option ``section.name`` for :class:`EvalOptions`: its one documentation line and
    its default, unless the evaluation has its own (``default``)."""
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    return _f(_default(f) if default is _SAME else default, f.metadata["doc"])


@dataclass
class EvalOptions:
    """The options of ``tandem-rlvr eval`` (flags, or the same keys in ``--config eval.yaml``), each
    documented once: an option the training config has too (sampling, the in-process mode, the vLLM
    memory share, answer checking, local-file columns, remote code) reuses that field's documentation
    and default (:func:`_reuse`), with the evaluation's own default where METHOD.md §5 sets one."""

    seniors: dict = _f({}, "Seniors to evaluate, name -> local path or hub name (--senior [NAME=]PATH, repeatable).")
    junior: str = _f("", "The frozen junior (local path or hub name): the first of ``juniors``.")
    juniors: dict = _f({}, "Juniors, name -> local path or hub name (--junior [NAME=]PATH, repeatable; any tokenizer: a junior with another vocabulary runs through the text bridge); several give a seniors x juniors matrix.")
    benchmarks: list = _f([], "Benchmark names (e.g. math500) or local JSONL/JSON/CSV/parquet files (--benchmark, repeatable).")
    out: str = _f("eval_out", "Output directory: eval.json, eval.md, plots, chains/, parts/.")
    n: int = _f(8, "Samples per problem.")
    max_new_tokens: int = _reuse(RolloutConfig, "max_new_tokens")
    limit: int | None = _f(None, "First N problems of each benchmark (None = all).")
    seed: int = _f(0, "Sampling seed.")
    batch_size: int = _f(64, "Chains per generation call.")
    reward: str = _f("math", "Reward function: math, gsm8k or boxed_exact.")
    curve_ps: list = _f([1.0, 0.75, 0.5, 0.25], "P(senior) values of the word-handoff curve (--no-curve: none).")
    temperature: float = _reuse(RolloutConfig, "temperature", 0.7)
    top_p: float = _reuse(RolloutConfig, "top_p", 0.8)
    top_k: int = _reuse(RolloutConfig, "top_k", 20)
    max_rounds: int = _f(150, "Step-handoff chains stop after this many turns (the word-handoff curve has no turn limit).")
    context: int = _f(4096, "Prompt + response token limit.")
    max_context: int = _f(0, "As model.max_context: positions the models read (0 = each model's own limit); a senior or junior that cannot read the chains at --context and --max-new-tokens stops the evaluation before the first forward.")
    split: str | None = _f(None, "Split of a named benchmark.")
    problem_key: str = _reuse(DataConfig, "problem_key")
    answer_key: str = _reuse(DataConfig, "answer_key")
    id_key: str | None = _f("id", "Id column of a local file (the row index where missing).")
    trust_remote_code: bool = _reuse(ModelConfig, "trust_remote_code")
    dtype: str = _f("auto", "auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16 or float16.")
    device: str = _f("auto", "auto, cpu, cuda, cuda:1, ...")
    reward_timeout_s: float = _reuse(DataConfig, "reward_timeout_s")
    reward_workers: int = _reuse(DataConfig, "reward_workers")
    chunk_tokens: int = _f(1024, "Tokens per vocabulary-sized scoring chunk.")
    score_batch: int = _f(8, "Chains per teacher-forced scoring forward.")
    progress: bool = _f(True, "Show progress bars.")
    overwrite: bool = _f(False, "Recompute finished (senior, benchmark) parts instead of reusing them.")
    engine: str = _f("hf", "Sampler of the chains: hf (in-process) or vllm (every chain, the word-handoff curve too, on one vLLM engine per senior that holds it and the junior; needs tandem-rlvr[vllm] and one vocabulary).")
    mode: str = _reuse(RolloutConfig, "mode")
    vllm_memory: float = _reuse(RolloutConfig, "vllm_memory")


def _select_k(select: str) -> int | None:
    """K of a ``val.select`` value ``pass@K`` (K in 1, 2, 4, 8: the pass@k validation computes), else None."""
    head, _, k = str(select).partition("@")
    return int(k) if head == "pass" and k in ("1", "2", "4", "8") else None


def eval_default(name: str) -> Any:
    """The default of an evaluation option."""
    return _default(next(f for f in dataclasses.fields(EvalOptions) if f.name == name))


def coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        word = _bool_word(value)
        if word is not None:
            return word
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, (float, str)) and not isinstance(value, bool):  # 1e3 (YAML 1.1: a string), 8.0
            try:
                if float(value) == int(float(value)):
                    return int(float(value))
            except (ValueError, OverflowError):
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        word = _str_word(value, key)
        if word is not None:
            return word
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, str):  # train.trackers=tensorboard or a,b: a comma-separated list
            return [v.strip() for v in value.split(",") if v.strip()]
    else:
        return value
    raise ConfigError(f"config key {key!r} must be {getattr(tp, '__name__', tp)}, got {value!r} ({type(value).__name__})")


def _bool_word(value: Any) -> bool | None:
    """A quoted or numeric boolean ("off", "yes", 0, 1, ...) as a bool; None if it is none."""
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return {"true": True, "yes": True, "on": True, "1": True,
                "false": False, "no": False, "off": False, "0": False}.get(value.strip().lower())
    return None


def _str_word(value: Any, key: str) -> str | None:
    """The word a user typed for a word-valued key that YAML read as something else.

    YAML 1.1 reads off/no/false as False (all "off": train.fsdp=off works, unquoted, in files and
    overrides), and the overrides read none/null as None (handoff.schedule=none). yes/on/true have
    no word to map to in any key; they get an error that says so.
    """
    if value is False:
        return "off"
    if value is None:
        return "none"
    if value is True:
        raise ConfigError(f"config key {key!r} takes a word, got True: YAML reads yes/on/true as a boolean; "
                          f"write the word you mean (quoted if it is one of those)")
    if isinstance(value, (int, float)):
        return str(value)
    return None


def _merge(obj: Any, data: dict, prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r}; valid keys here: {', '.join(sorted(names))}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {dotted!r} must be a mapping, got {value!r}")
            _merge(current, value, dotted + ".")
        else:
            setattr(obj, key, coerce(value, hints[key], dotted))


def parse_overrides(overrides: list[str]) -> dict:
    """``["algo.lr=1e-5", "train.steps=3"]`` → nested dict (values parsed as YAML scalars)."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else ""
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            value = None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None) -> Config:
    """Build a validated :class:`Config` from ``base`` dict, a YAML file, then dotted overrides."""
    cfg = Config()
    if base:
        _merge(cfg, base)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid UTF-8 (byte {e.start})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_why(e)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
        _merge(cfg, data)
    if overrides:
        _merge(cfg, parse_overrides(overrides))
    validate(cfg)
    return cfg


def _yaml_why(e: yaml.YAMLError) -> str:
    """One line: the parser's problem and where (PyYAML's own message spans several lines)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what


def _engine_refusal(cfg: Config) -> tuple[str, str | None]:
    """``(key, reason)``: the engine the config selects, asked about the schedule its arm rolls out."""
    from tandem_rlvr.engines.serving import ENGINES, serving

    r, bridge = cfg.rollout, cfg.model.bridge
    if r.engine not in ENGINES:
        return "rollout.engine", f"must be {' or '.join(ENGINES)}, got {r.engine!r}"
    if bridge and r.engine != "hf":
        return "rollout.engine", f"{r.engine} does not run the text bridge (model.bridge); use rollout.engine=hf"
    schedule = cfg.handoff.schedule if cfg.algo.arm == "trlvr" else "none"
    why = serving(r.engine, bridge=bridge).refusal(schedule)
    if why is not None and cfg.algo.arm != "trlvr":
        why += f" (algo.arm={cfg.algo.arm} rolls out solo)"
    return ("model.bridge" if bridge else "rollout.engine"), why


def validate(cfg: Config) -> None:
    """Cross-field checks; raises :class:`ConfigError` naming the key."""
    from tandem_rlvr.engines.serving import MODES
    from tandem_rlvr.names import LOSS_TYPES, REWARD_KINDS, SCHEDULES

    a, h, t, r = cfg.algo, cfg.handoff, cfg.train, cfg.rollout
    checks = [
        (bool(cfg.model.senior), "model.senior", "must name a model (a local path or hub name)"),
        (cfg.model.self_paired or bool(cfg.model.junior), "model.junior", "is required unless model.self_paired is true"),
        (not (cfg.model.self_paired and cfg.model.junior), "model.junior", "must be empty when model.self_paired is true"),
        (cfg.model.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"must be float32, bfloat16 or float16, got {cfg.model.dtype!r}"),
        (cfg.model.junior_dtype in ("", "float32", "bfloat16", "float16"), "model.junior_dtype",
         f"must be empty (= model.dtype), float32, bfloat16 or float16, got {cfg.model.junior_dtype!r}"),
        (a.arm in ARMS, "algo.arm", f"must be one of {', '.join(ARMS)}, got {a.arm!r}"),
        (a.group_size >= 2, "algo.group_size", f"must be >= 2 (GRPO needs a group), got {a.group_size}"),
        (a.loss_type in LOSS_TYPES, "algo.loss_type", f"must be one of {', '.join(LOSS_TYPES)}, got {a.loss_type!r}"),
        (a.kl_beta >= 0, "algo.kl_beta", "must be >= 0"),
        (a.arm != "kl_reg" or a.kl_beta > 0, "algo.kl_beta", "must be > 0 for the kl_reg arm"),
        (a.arm == "kl_reg" or a.kl_beta == 0, "algo.kl_beta", f"is only used by the kl_reg arm; set it to 0 for {a.arm!r}"),
        (0 < a.clip_eps < 1, "algo.clip_eps", f"must be in (0, 1), got {a.clip_eps}"),
        (a.lr > 0 and math.isfinite(a.lr), "algo.lr", f"must be a finite number > 0, got {a.lr}"),
        (a.max_grad_norm >= 0, "algo.max_grad_norm", f"must be >= 0 (0 = off), got {a.max_grad_norm}"),
        (a.clip_eps_high is None or a.clip_eps_high > 0, "algo.clip_eps_high", f"must be > 0 or None, got {a.clip_eps_high}"),
        (a.mini_batch_prompts >= 0 and t.prompts_per_step % (a.mini_batch_prompts or 1) == 0, "algo.mini_batch_prompts",
         f"must be 0 (all prompts of the step) or divide train.prompts_per_step ({t.prompts_per_step}), got {a.mini_batch_prompts}"),
        (a.ppo_epochs >= 1 and a.micro_batch >= 0, "algo.ppo_epochs", "ppo_epochs must be >= 1 and micro_batch >= 0"),
        (h.schedule in SCHEDULES, "handoff.schedule", f"must be one of {', '.join(SCHEDULES)}, got {h.schedule!r}"),
        (0.0 <= h.p <= 1.0, "handoff.p", f"must be in [0, 1], got {h.p}"),
        (h.max_gap >= 1 and h.chunk_size >= 1, "handoff.max_gap", "max_gap and chunk_size must be >= 1"),
        (r.max_new_tokens >= 1 and r.max_prompt_tokens >= 1, "rollout.max_new_tokens", "token budgets must be >= 1"),
        (cfg.model.max_context >= 0, "model.max_context", f"must be >= 0 (0 = each model's own limit), got {cfg.model.max_context}"),
        (r.temperature > 0, "rollout.temperature", "must be > 0 for GRPO sampling"),
        (0 < r.top_p <= 1 and r.top_k >= 0, "rollout.top_p", "top_p must be in (0, 1] and top_k >= 0"),
        (r.batch_size == 0 or r.batch_size % a.group_size == 0, "rollout.batch_size", "must be 0 or a multiple of algo.group_size"),
        (r.mode in MODES, "rollout.mode", f"must be {' or '.join(MODES)}, got {r.mode!r}"),
        (t.steps >= 1 and t.prompts_per_step >= 1, "train.steps", "steps and prompts_per_step must be >= 1"),
        (t.save_every >= 0 and t.keep_last >= 1, "train.save_every", "save_every must be >= 0 and keep_last >= 1"),
        (t.max_nonfinite >= 1, "train.max_nonfinite", f"must be >= 1, got {t.max_nonfinite}"),
        (0 < cfg.data.reward_timeout_s < math.inf and cfg.data.reward_workers >= 1, "data.reward_timeout_s", "must be > 0 (and reward_workers >= 1)"),
        (cfg.val.every == 0 or bool(cfg.val.data), "val.data", "is required when val.every > 0"),
        (_select_k(cfg.val.select) is not None and _select_k(cfg.val.select) <= cfg.val.n, "val.select",
         f"must be pass@K with K in 1, 2, 4, 8 and K <= val.n ({cfg.val.n}), got {cfg.val.select!r}"),
        (not cfg.model.bridge or (a.arm == "trlvr" and not cfg.model.self_paired),
         "model.bridge", "needs algo.arm=trlvr and a separate model.junior (per-token KL needs one shared vocabulary)"),
        (cfg.data.reward in REWARD_KINDS or ":" in cfg.data.reward, "data.reward",
         f"must be {', '.join(REWARD_KINDS)} or package.module:function, got {cfg.data.reward!r}"),
    ]
    if a.senior_frac_band is not None:
        band = a.senior_frac_band
        ok = len(band) == 2 and all(isinstance(x, (int, float)) for x in band) and 0 <= band[0] <= band[1] <= 1
        checks.append((ok, "algo.senior_frac_band", f"must be [low, high] with 0 <= low <= high <= 1, got {band}"))
    for ok, key, msg in checks + _engine_checks(cfg) + _fault_checks(t):
        if not ok:
            raise ConfigError(f"config key {key!r} {msg}")


def _engine_checks(cfg: Config) -> list:
    """Checks of the rollout engine's keys and of the senior's sharding (train.fsdp)."""
    from tandem_rlvr.names import FSDP_MODES, SCHEDULES, VLLM_SLEEP

    t, r = cfg.train, cfg.rollout
    engine_key, engine_why = _engine_refusal(cfg) if cfg.handoff.schedule in SCHEDULES else ("rollout.engine", None)
    return [
        (engine_why is None, engine_key, engine_why),
        (r.vllm_timeout_s > 0, "rollout.vllm_timeout_s", f"must be > 0, got {r.vllm_timeout_s}"),
        (0 < r.vllm_memory <= 1, "rollout.vllm_memory", f"must be in (0, 1], got {r.vllm_memory}"),
        (r.vllm_dtype in ("model", "float32", "bfloat16", "float16"), "rollout.vllm_dtype",
         f"must be model, float32, bfloat16 or float16, got {r.vllm_dtype!r}"),
        (r.vllm_sleep in VLLM_SLEEP, "rollout.vllm_sleep", f"must be {', '.join(VLLM_SLEEP)}, got {r.vllm_sleep!r}"),
        (t.fsdp in FSDP_MODES, "train.fsdp", f"must be {', '.join(FSDP_MODES[:-1])} or {FSDP_MODES[-1]}, got {t.fsdp!r}"),
        (t.fsdp == "off" or not cfg.model.lora_r, "train.fsdp",
         "shards full fine-tuning only: a LoRA senior's trained weights (the adapter) are small, so every process "
         "keeps a copy; train it with train.fsdp=off (DDP)"),
        (t.fsdp == "off" or not cfg.model.bridge, "train.fsdp",
         "is not tested with a junior that reads another tokenizer (model.bridge, the text bridge); "
         "use train.fsdp=off"),
    ]


def _fault_checks(t: TrainConfig) -> list:
    """Checks of the preemption, watchdog and collective-timeout keys (see tandem_rlvr.training.preempt)."""
    return [
        (0 < t.preempt_exit_code < 256 and t.preempt_exit_code not in (2, 75, 124), "train.preempt_exit_code",
         f"must be in 1..255 and differ from the other exit codes (2, 75, 124), got {t.preempt_exit_code}"),
        (t.watchdog_s >= 0 and math.isfinite(t.watchdog_s), "train.watchdog_s", f"must be >= 0 (0 = off), got {t.watchdog_s}"),
        (0 < t.collective_timeout_s < math.inf, "train.collective_timeout_s", f"must be a finite number > 0, got {t.collective_timeout_s}"),
    ]


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from tandem_rlvr.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def describe() -> str:
    """Every config key with its default and documentation, one per line; then the eval options."""
    lines = []
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(section.type if isinstance(section.type, type) else typing.get_type_hints(Config)[section.name]):
            lines.append(f"{section.name}.{f.name} (default {_default(f)!r}): {f.metadata.get('doc', '')}")
    lines.append("")
    lines.append("tandem-rlvr eval options (flags --name-with-dashes, or keys of --config eval.yaml):")
    for f in dataclasses.fields(EvalOptions):
        lines.append(f"eval {f.name} (default {_default(f)!r}): {f.metadata.get('doc', '')}")
    return "\n".join(lines)
