"""One typed configuration for training: YAML files plus dotted ``key=value`` overrides.

Every field is documented once, here, in its ``doc`` metadata (``tandem-rlvr config-help`` prints
them). Unknown keys and wrong types are rejected with the key's dotted name; cross-field checks run
at load time; the resolved config is written to the run directory. This module knows nothing of torch.

The loader's parts (:func:`read_config_file`, :func:`merge`, :func:`reuse`) also load the options of
``tandem-rlvr eval`` (:mod:`tandem_rlvr.evaluation.options`): the same YAML reading, merging, coercion
(:mod:`tandem_rlvr.config_values`) and bounds (:mod:`tandem_rlvr.config_bounds`).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tandem_rlvr.config_bounds import allowed, bounds_of, check_fields, default_of, model_checks, run_dir_problem
from tandem_rlvr.config_bounds import option as _f  # a field, its documentation line and its allowed values
from tandem_rlvr.config_values import coerce
from tandem_rlvr.configs import resolve
from tandem_rlvr.data_keys import data_checks, reward_path
from tandem_rlvr.engines.schedules import SCHEDULES
from tandem_rlvr.engines.serving import ENGINES, MODES
from tandem_rlvr.errors import ConfigError  # noqa: F401 (raised here; also importable from here)
from tandem_rlvr.names import ATTN_IMPLEMENTATIONS, FSDP_MODES, LOSS_TYPES, MIXED_PRECISION, VLLM_SLEEP
from tandem_rlvr.trackers import naming_checks

ARMS = ("trlvr", "grpo", "kl_reg")
LR_DECAYS = ("constant", "linear", "cosine")  # the LR after the warm-up (tandem_rlvr.training.build.lr_factor)

DTYPES = ("float32", "bfloat16", "float16")
MAX_SEED = 2**32 - 1  # numpy's legacy seeding (np.random.seed) takes 0 .. 2**32 - 1


@dataclass
class ModelConfig:
    senior: str = _f("", "Senior (trained) model: a local directory or a Hugging Face hub name.")
    junior: str | None = _f(None, "Junior (frozen) model: local directory or hub name. Unused when self_paired.")
    self_paired: bool = _f(False, "Junior = frozen copy of the senior's starting weights (the paper's main setting).")
    trust_remote_code: bool = _f(False, "Allow model code from the checkpoint to run. Off unless you ask.")
    bridge: bool = _f(False, "Junior with a different tokenizer: co-write through text, re-encoding each turn (trlvr with handoff step or alternate only).")
    dtype: str = _f("float32", "Weights dtype: float32, bfloat16 or float16.", choices=DTYPES)
    junior_dtype: str = _f("", "Weights dtype of the frozen junior in the trainer (its log-probs): float32, bfloat16 or float16; empty = model.dtype. The paper configs keep it in bfloat16 (8 instead of 16 GB of a 4B model per GPU).", choices=("", *DTYPES))
    lora_r: int = _f(0, "LoRA rank for the senior (0 = full fine-tuning). With self_paired, the junior is the base with the adapter off.", ge=0)
    lora_alpha: int = _f(32, "LoRA alpha.", gt=0)
    lora_targets: list = _f(["q_proj", "k_proj", "v_proj", "o_proj"], "Module names LoRA adapts (not the embeddings of a model that ties its input and output embeddings: refused).")
    max_context: int = _f(0, "Positions the models read (0 = each model's own: max_position_embeddings, with a declared linear/dynamic/yarn rope factor, else the tokenizer's model_max_length). Prompts that do not fit with the whole response budget are skipped and counted; a budget that fits no prompt stops the run before the first forward. Set it only for a model that reads more than its config says (rope scaling): the run goes on with a warning.", ge=0, note="0 = each model's own limit")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward (transformers' gradient checkpointing): less memory for the update, ~30% more compute; on in the paper configs.")
    attn_implementation: str = _f("", "Attention kernel of the trainer's senior and junior (transformers' attn_implementation): empty = transformers' default (sdpa where the model supports it), eager, sdpa, flash_attention_2 (needs the flash-attn package and a GPU), flash_attention_3 or flex_attention. The vLLM engine picks its own kernel (VLLM_ATTENTION_BACKEND).", choices=ATTN_IMPLEMENTATIONS)
    revision: str = _f("", "Hub revision (branch, tag or commit) of model.senior, its tokenizer and the self-paired junior; empty = the default branch. Ignored, with a warning, for a local directory; the vLLM engines read the model's snapshot at this revision.")
    junior_revision: str = _f("", "Hub revision of model.junior and its tokenizer (a separate junior only); empty = its default branch.")
    mixed_precision: str = _f("", "Mixed precision of the update (accelerate's Accelerator(mixed_precision=...)): empty = the accelerate launch config's (else off), off (no or false: float32 compute), bf16 (compute in bf16 over model.dtype=float32 weights) or fp16 (a CUDA GPU and no train.fsdp: the sharded senior gets no loss scaling).", choices=MIXED_PRECISION)


@dataclass
class AlgoConfig:
    arm: str = _f("trlvr", "trlvr (tandem rollouts, senior-token loss), grpo (solo, all tokens) or kl_reg (solo + beta*k3 KL to the junior).", choices=ARMS)
    group_size: int = _f(8, "Rollouts per prompt (G).", ge=2, note="GRPO needs a group")
    loss_type: str = _f("grpo", "Aggregation: grpo (per-sequence mean, then batch mean), dapo (token mean over the step's tokens) or dr_grpo (sum / (B*max_len)).", choices=LOSS_TYPES)
    normalize_std: bool = _f(True, "Divide advantages by the group std (False = Dr. GRPO).")
    kl_beta: float = _f(0.0, "Weight of the k3 KL(senior || junior) term; > 0 required for kl_reg, 0 for the others.", ge=0)
    kl_clamp: float = _f(0.0, "Clamp each token's k3 KL to at most this value (its log-ratio first to +-20), as verl's low_var_kl does with 10 in the paper authors' runs (a token held by the clamp gets no KL gradient); 0 = no clamp, the plain k3 of the method.", ge=0)
    clip_eps: float = _f(0.2, "PPO clip epsilon (lower side; the upper side too unless clip_eps_high is set).", gt=0, lt=1)
    clip_eps_high: float | None = _f(None, "Upper clip epsilon (DAPO clip-higher); None = clip_eps.", gt=0)
    lr: float = _f(1e-6, "AdamW learning rate.", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay.", ge=0)
    max_grad_norm: float = _f(1.0, "Gradient-norm clip (0 = off).", ge=0, note="0 = off")
    warmup_steps: int = _f(0, "Linear LR warm-up steps (then algo.lr_decay).", ge=0)
    lr_decay: str = _f("constant", "The LR after the warm-up: constant (the paper's), linear or cosine (from algo.lr down to 0 at the run's last step, train.steps).", choices=LR_DECAYS)
    mini_batch_prompts: int = _f(0, "Prompts per PPO mini-batch (one optimizer update each); 0 = all of the step's prompts (one update per step and epoch).", ge=0)
    ppo_epochs: int = _f(1, "Passes over each step's rollouts.", ge=1)
    micro_batch: int = _f(0, "Rollouts per forward/backward chunk (gradient accumulation) and per no-grad log-prob forward; 0 = the whole mini-batch (the whole step's rollouts for the no-grad passes). Either way at most as many as keep one forward's logits within 2^28 elements (training.core.forward_rows): one rollout at Qwen3's vocabulary and 3,000 tokens.", ge=0)
    old_logps: str = _f("auto", "The PPO ratio's old log-probs: rollout (the ones the in-process engine recorded while it sampled: no extra forward), recompute (one teacher-forced pass of the senior before the update; needed where the engine records none, e.g. vLLM or the text bridge, and wise where decode and training differ in precision) or auto (rollout where the engine recorded them and the senior computes in float32: float32 weights, no mixed precision; else recompute). Both give the same numbers up to floating-point order.", choices=("auto", "rollout", "recompute"))
    senior_frac_band: list | None = _f(None, "Optional [low, high] band on a trlvr step's senior token share; outside it the run stops. None = no band (every step's ownership mask is still checked against the schedule's record, and its coins against handoff.p).")


@dataclass
class HandoffConfig:
    schedule: str = _f("word", f"{', '.join(SCHEDULES)} (used by the trlvr arm; grpo/kl_reg roll out solo); each is defined once in tandem_rlvr.engines.schedules.", choices=SCHEDULES)
    p: float = _f(0.5, "P(senior) of each handoff coin.", ge=0, le=1)
    max_gap: int = _f(32, "Word and sentence schedules: redraw the author after K tokens without a word boundary (sentence: a sentence end).", ge=1)
    chunk_size: int = _f(16, "Chunk schedule: redraw every N tokens.", ge=1)


@dataclass
class RolloutConfig:
    max_new_tokens: int = _f(3000, "Response budget shared by both authors.", ge=1)
    max_prompt_tokens: int = _f(1024, "Longer prompts are skipped and counted.", ge=1)
    temperature: float = _f(0.6, "Sampling temperature of both models.", gt=0, note="GRPO samples its rollouts")
    top_p: float = _f(1.0, "Nucleus sampling threshold.", gt=0, le=1)
    top_k: int = _f(0, "Top-k sampling (0 = off).", ge=0, note="0 = off")
    batch_size: int = _f(0, "Rollouts per engine call (0 = all of this process's rollouts of the step at once). A multiple of group_size.", ge=0)
    engine: str = _f("hf", "Rollout engine: hf (in-process, every schedule) or vllm (every schedule; tandem rollouts on one vLLM engine that holds both models and decodes each rollout as one request, solo arms on a plain vLLM engine of the senior; needs tandem-rlvr[vllm]). A junior with another tokenizer (model.bridge) always uses the text bridge (step/alternate).", choices=ENGINES)
    mode: str = _f("lockstep", "How the in-process engine keeps both models in step (same tokens, owners and log-probs on the same seed): lockstep (both models read every token: one forward each per token) or catchup (a model runs only when it writes, then reads the tokens it missed in one forward; wins with small batches and long turns).", choices=MODES)
    vllm_memory: float = _f(0.3, "Share of the accelerator's memory the vLLM engine may take (in training it shares the device with the update).", gt=0, le=1)
    vllm_timeout_s: float = _f(600.0, "Stop the run (the last checkpoint is kept) when a vLLM rollout or weight push does not finish within this many seconds.", gt=0)
    vllm_dtype: str = _f("model", "Weights dtype of the vLLM engine: model (= model.dtype), bfloat16, float16 or float32. The paper configs train float32 master weights and decode in bfloat16; each push casts the senior's weights.", choices=("model", *DTYPES))
    vllm_sleep: str = _f("off", "What the vLLM engine gives back to training between its rollouts (vLLM sleep mode, GPUs only): off (keeps everything), kv (releases its KV cache during the update) or weights (also moves its weights to host memory; they come back before the push). Accepted and ignored on a CPU (one log line).", choices=VLLM_SLEEP)


@dataclass
class TrainConfig:
    steps: int = _f(200, "Training steps (each: prompts_per_step prompts x group_size rollouts).", ge=1)
    prompts_per_step: int = _f(16, "Prompts per step.", ge=1)
    save_every: int = _f(50, "Checkpoint every N steps (0 = only final).", ge=0)
    keep_last: int = _f(3, "Checkpoints kept (older ones are deleted).", ge=1)
    seed: int = _f(0, "Seed for data order, sampling and handoff coins.", ge=0, le=MAX_SEED)
    out_dir: str = _f("runs/trlvr", "Run directory: config.yaml, metrics.jsonl, checkpoints/, final/. A leading ~ is expanded when the config loads; empty, ., /, the home directory, the current directory (or one that holds them) are refused.")
    max_nonfinite: int = _f(3, "Stop (with a checkpoint) after this many non-finite updates in a row.", ge=1)
    trackers: list = _f([], "Extra accelerate trackers, e.g. [tensorboard] or [wandb].")
    progress: bool = _f(True, "Show a progress bar.")
    preempt_exit_code: int = _f(143, "Exit code after SIGTERM/SIGUSR1/SIGINT stopped the run with a checkpoint (a requeue script tells it from a failure; 143 = 128 + SIGTERM).", ge=1, le=255)
    watchdog_s: float = _f(1800.0, "Stop with a stack dump of every thread (exit 124) when a step makes no progress for this many seconds (0 = off).", ge=0, note="0 = off")
    collective_timeout_s: float = _f(1800.0, "Multi-process: a collective waiting longer than this for a peer fails, and the run stops naming the vanished rank (exit 75).", gt=0)
    fsdp: str = _f("off", "Shard the senior over the processes with FSDP2: off (DDP, a full copy each), full (parameters, gradients, AdamW states sharded; like ZeRO-3) or zero2 (gradients and AdamW states; like ZeRO-2). Needs a multi-process launch.", choices=FSDP_MODES)
    project: str = _f("tandem-rlvr", "Tracker project: the wandb project, and the folder of TensorBoard's logs in the run directory. Letters, digits, ., _ and - (1 to 128, not starting with . or -); fixed for a run (a resumed run keeps it).")
    run_name: str = _f("", "Tracker run name (wandb's run name); empty = the run directory's name. At most 128 characters.")
    group: str = _f("", "Tracker group (wandb's group, e.g. one per sweep); empty = none. At most 128 characters.")
    tags: list = _f([], "Tracker tags (wandb's tags), e.g. [trlvr, qwen3]; each 1 to 64 characters.")
    log_every: int = _f(10, "When stderr is no terminal (a SLURM log, a pipe), one plain log line every N steps (and at the last) instead of a progress bar; also the period of train.log_samples.", ge=1)
    log_samples: int = _f(0, "Co-written completions (one per prompt first) of the main process's rollouts written every train.log_every steps to samples.jsonl in the run directory, each as its turns with their authors (senior, junior), and to wandb as a table and TensorBoard as text; 0 = none.", ge=0, le=1024)


@dataclass
class DataConfig:
    train: str = _f("deepscaler", "Training data: a benchmark name (docs/rewards-and-data.md), arith/train, a local JSONL/JSON/CSV/parquet file, a Hugging Face dataset id org/name (datasets.load_dataset; offline: from the local datasets cache) or a dataset directory (Dataset.save_to_disk, or a folder of data files). A relative path is read from the current directory.")
    train_split: str | None = _f(None, "Split of a named benchmark or a Hugging Face dataset (default: the benchmark's training split; a dataset's train split, or its only one).")
    subset: str = _f("", "Config (subset) name of a Hugging Face dataset id in data.train (load_dataset's second argument); empty = the dataset's default.")
    problem_key: str = _f("problem", "Problem column of a local file or Hugging Face dataset.")
    answer_key: str = _f("answer", "Answer column of a local file or Hugging Face dataset.")
    prompt_key: str = _f("", "Column holding each row's prompt as chat messages (a list of {role, content}, or that list as JSON text in a CSV cell; other text is one user turn), rendered as written with the chat template (no template, no suffix); its last user turn is the problem text. Empty = the prompt is built from data.problem_key. Files and Hugging Face datasets only; also val.data's column.")
    prompt_template: str = _f("", "The user turn, every {problem} replaced by the problem (other braces kept as written: \\boxed{} needs no escaping); must contain {problem}. Empty = the problem + the paper's instruction (tandem_rlvr.prompts.PROMPT_SUFFIX). Not with data.prompt_key. Applies to validation too.")
    system_prompt: str = _f("", "A system message before the user turn (empty = none; a prompt column's own system message wins). Applies to validation too.")
    chat_template_kwargs: dict = _f({}, "Extra keyword arguments of tokenizer.apply_chat_template, e.g. {enable_thinking: false} for Qwen3. Applies to validation too.")
    reward: str = _f("math", "Reward: math (math-verify on the last \\boxed{}), gsm8k, boxed_exact, or your own function as package.module:function or path/to/file.py:function (a relative path from the config file's directory; given on the command line, from the current directory), plain (completion, gold) or with TRL's reward signature (docs/trl.md); run in-process, no time limit.")
    reward_timeout_s: float = _f(2.0, "Hard time limit of one answer check.", gt=0)
    reward_workers: int = _f(2, "Worker processes for answer checking.", ge=1)


@dataclass
class ValConfig:
    data: str | None = _f(None, "Validation data (as data.train: a name, file, dataset id or directory, with data's columns and prompt keys); None = no validation.")
    split: str | None = _f(None, "Split of a named benchmark or Hugging Face dataset, e.g. val for deepscaler's 1,000 held-out problems (a dataset with several splits needs it).")
    subset: str = _f("", "Config (subset) name of a Hugging Face dataset id in val.data; empty = the dataset's default.")
    every: int = _f(0, "Validate every N steps (0 = off).", ge=0)
    n: int = _f(4, "Samples per validation problem.", ge=1)
    limit: int = _f(64, "Validation problems used (0 = all).", ge=0, note="0 = all")
    max_new_tokens: int = _f(0, "Validation budget (0 = rollout.max_new_tokens).", ge=0)
    select: str = _f("pass@1", "The validation metric whose best value picks best/: pass@K with K <= val.n (the paper's authors: pass@4 of 4 samples per problem). best/best.json records the metric, its value and the step.")
    temperature: float = _f(0.7, "Validation sampling temperature (0 = greedy). Default: the evaluation's (docs/evaluation.md); the paper's authors validated at 0.6.", ge=0)
    top_p: float = _f(0.8, "Validation nucleus threshold. Default: the evaluation's; the paper's authors: 0.95.", gt=0, le=1)
    top_k: int = _f(20, "Validation top-k (0 = off). Default: the evaluation's; the paper's authors: 0 (off).", ge=0)


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
        band = self.algo.senior_frac_band
        return None if band is None else (float(band[0]), float(band[1]))


_SAME = object()


def reuse(section: type, name: str, default: Any = _SAME, **bounds) -> Any:
    """The training config's option ``section.name`` for another command's options (those of ``tandem-rlvr eval``,
    :class:`~tandem_rlvr.evaluation.options.EvalOptions`): its one documentation line, its default and its
    allowed values, unless that command has its own (``default``, ``bounds``)."""
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    b = bounds_of(f)
    if not bounds and b is not None:
        bounds = dict(ge=b.ge, gt=b.gt, le=b.le, lt=b.lt, choices=b.choices, note=b.note)
    return _f(default_of(f) if default is _SAME else default, f.metadata["doc"], **bounds)


def config_key(dotted: str) -> str:
    """How an error names a training config key: ``config key 'algo.lr'``."""
    return f"config key {dotted!r}"


def merge(obj: Any, data: dict, name: Callable[[str], str] = config_key, prefix: str = "") -> None:
    """Set the fields of dataclass ``obj`` (nested sections too) from ``data`` (a YAML file's mapping, parsed
    overrides, flags), each value coerced to its field's type (:func:`~tandem_rlvr.config_values.coerce`);
    ``name(dotted key)`` names a key in the one-line errors (an unknown key, a value of the wrong type)."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown {name(dotted)}; valid keys here: {', '.join(sorted(names))}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{name(dotted)} must be a mapping, got {value!r}")
            merge(current, value, name, dotted + ".")
        else:
            _refuse_null_word(type(obj), key, value, hints[key], name(dotted))
            setattr(obj, key, coerce(value, hints[key], name(dotted)))


def _refuse_null_word(cls: type, name: str, value: Any, tp: Any, key: str) -> None:
    """YAML reads ``~``/``null`` as None: a word-valued key whose allowed words include ``none``/``off``
    takes it as that word; any other plain string key (a path, a model) refuses it instead of becoming
    a folder or model named "none"."""
    if value is not None or tp is not str:
        return
    b = bounds_of(next(f for f in dataclasses.fields(cls) if f.name == name))
    if not (b and b.choices and {"none", "off"} & set(b.choices)):
        raise ConfigError(f"{key} must be a string, got null (YAML reads ~, null and an empty "
                          "value as null: quote the text, or give a path)")


def parse_overrides(overrides: list[str]) -> dict:
    """``["algo.lr=1e-5", "train.steps=3"]`` → nested dict (values parsed as YAML scalars; a bare ``~`` is the
    home directory, as the shell would read it, not YAML's null: write none or null for that)."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
        key, raw = item.split("=", 1)
        value = _override_value(key.strip(), raw) if raw.strip() not in ("", "~") else raw.strip()
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            value = None
        set_dotted(out, key, value)
    return out


def _override_value(key: str, raw: str):
    """An override's value: YAML, but a text key (``data.prompt_template=Q: {problem}``, which YAML would read as
    a mapping or not at all) takes the text as written; another key's value that is not YAML is one error."""
    tp, text = Config, False
    for part in key.split("."):
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in hints:
            tp = None
            break
        tp = hints[part]
    if tp is not None:
        text = tp is str or str in typing.get_args(tp)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        if text:
            return raw.strip()
        raise ConfigError(f"{config_key(key)}: {raw!r} is not a YAML value ({str(e).splitlines()[0]}); quote it "
                          "or fix its syntax") from None
    return raw.strip() if text and isinstance(value, (dict, list)) else value


def set_dotted(tree: dict, dotted: str, value) -> dict:
    """Set ``tree["a"]["b"] = value`` for ``dotted="a.b"``, creating the missing levels; returns ``tree``.
    The one reading of a dotted key: command-line overrides and the demo plan's overrides."""
    *parents, leaf = dotted.strip().split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None) -> Config:
    """A validated :class:`Config` from ``base``, a YAML file or a shipped config's name, then dotted overrides."""
    cfg = Config()
    if base:
        merge(cfg, base)
    if path is not None:
        data, p = read_config_file(path)
        merge(cfg, data)
        reward_path(cfg.data, p.resolve().parent)  # a reward.py beside the config file (others: the cwd)
    if overrides:
        merge(cfg, parse_overrides(overrides))
        reward_path(cfg.data, Path.cwd())  # a relative reward file given on the command line: from the cwd
    cfg.train.out_dir = os.path.expanduser(cfg.train.out_dir)  # once, here: the run, preflight and resume agree
    validate(cfg)
    return cfg


def read_config_file(path: str | Path, kind: str | None = "train", what: str = "config file") -> tuple[dict, Path]:
    """The mapping of a YAML config file, or of a shipped config's name (``trlvr``, ``paper/eval``; tandem_rlvr.configs,
    listed by ``kind``), and its path; ``what`` names it in the one-line errors."""
    p = resolve(path, kind=kind, what=what)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {str(p)!r} is not valid UTF-8 (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML: {_yaml_why(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(p)!r} must hold a mapping at the top level")
    return data, p


def _yaml_why(e: yaml.YAMLError) -> str:
    """One line: the parser's problem and where (PyYAML's own message spans several lines)."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else what


def _engine_refusal(cfg: Config) -> tuple[str, str | None]:
    """``(key, reason)``: the engine the config selects, asked about the schedule its arm rolls out."""
    from tandem_rlvr.engines.serving import serving

    r, bridge = cfg.rollout, cfg.model.bridge
    if bridge and r.engine != "hf":
        return "rollout.engine", f"{r.engine} does not run the text bridge (model.bridge); use rollout.engine=hf"
    schedule = cfg.handoff.schedule if cfg.algo.arm == "trlvr" else "none"
    why = serving(r.engine, bridge=bridge).refusal(schedule)
    if why is not None and cfg.algo.arm != "trlvr":
        why += f" (algo.arm={cfg.algo.arm} rolls out solo)"
    return ("model.bridge" if bridge else "rollout.engine"), why


def validate(cfg: Config) -> None:
    """Every key against the values its field declares (:func:`~tandem_rlvr.config_bounds.check_fields`), then
    the checks that read several keys; raises a one-line :class:`ConfigError` naming the key."""
    for section in dataclasses.fields(cfg):
        check_fields(getattr(cfg, section.name), lambda name, s=section.name: f"config key '{s}.{name}'")
    problem = run_dir_problem(cfg.train.out_dir)
    if problem is not None:
        raise ConfigError(f"config key 'train.out_dir' {problem}")
    checks = _cross_checks(cfg) + data_checks(cfg) + _engine_checks(cfg) + model_checks(cfg) + naming_checks(cfg.train)
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"config key {key!r} {msg}")


def _cross_checks(cfg: Config) -> list:
    """The checks that read more than one key (those of the data and val sections: data_keys.data_checks)."""
    a, t, r = cfg.algo, cfg.train, cfg.rollout
    checks = [
        (bool(cfg.model.senior), "model.senior", "must name a model (a local path or hub name)"),
        (cfg.model.self_paired or bool(cfg.model.junior), "model.junior", "is required unless model.self_paired is true"),
        (not (cfg.model.self_paired and cfg.model.junior), "model.junior", "must be empty when model.self_paired is true"),
        (a.arm != "kl_reg" or a.kl_beta > 0, "algo.kl_beta", "must be > 0 for the kl_reg arm"),
        (a.arm == "kl_reg" or a.kl_beta == 0, "algo.kl_beta", f"is only used by the kl_reg arm; set it to 0 for {a.arm!r}"),
        (t.prompts_per_step % (a.mini_batch_prompts or 1) == 0, "algo.mini_batch_prompts",
         f"must be 0 (all prompts of the step) or divide train.prompts_per_step ({t.prompts_per_step}), got {a.mini_batch_prompts}"),
        (r.batch_size % a.group_size == 0, "rollout.batch_size", "must be 0 or a multiple of algo.group_size"),
        (t.preempt_exit_code not in (2, 75, 124), "train.preempt_exit_code",
         f"must be in 1..255 and differ from the other exit codes (2, 75, 124), got {t.preempt_exit_code}"),
        (not cfg.model.bridge or (a.arm == "trlvr" and not cfg.model.self_paired),
         "model.bridge", "needs algo.arm=trlvr and a separate model.junior (per-token KL needs one shared vocabulary)"),
    ]
    if a.senior_frac_band is not None:
        band = a.senior_frac_band
        ok = len(band) == 2 and all(isinstance(x, (int, float)) for x in band) and 0 <= band[0] <= band[1] <= 1
        checks.append((ok, "algo.senior_frac_band", f"must be [low, high] with 0 <= low <= high <= 1, got {band}"))
    return checks


def _engine_checks(cfg: Config) -> list:
    """Checks of the rollout engine against the arm's schedule, and of the senior's sharding (train.fsdp)."""
    t = cfg.train
    engine_key, engine_why = _engine_refusal(cfg)
    return [
        (engine_why is None, engine_key, engine_why),
        (t.fsdp == "off" or not cfg.model.lora_r, "train.fsdp",
         "shards full fine-tuning only: a LoRA senior's trained weights (the adapter) are small, so every process "
         "keeps a copy; train it with train.fsdp=off (DDP)"),
        (t.fsdp == "off" or not cfg.model.bridge, "train.fsdp",
         "is not tested with a junior that reads another tokenizer (model.bridge, the text bridge); "
         "use train.fsdp=off"),
    ]


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    from tandem_rlvr.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def help_line(head: str, cls: type, f: dataclasses.Field) -> str:
    """``head (default D): doc [allowed: ...]`` (the bracket only where the field declares its values)."""
    rng = allowed(cls, f)
    return f"{head} (default {default_of(f)!r}): {f.metadata.get('doc', '')}" + (f" [allowed: {rng}]" if rng else "")


def describe() -> str:
    """Every training config key with its default, documentation and allowed values, one per line (``tandem-rlvr
    config-help`` adds the eval options: :func:`tandem_rlvr.evaluation.options.describe`)."""
    lines = []
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        lines += [help_line(f"{section.name}.{f.name}", hints[section.name], f) for f in dataclasses.fields(hints[section.name])]
    return "\n".join(lines)
