"""Loading the senior (trainable) and the junior (frozen), and checking that they can co-write.

Frozen models are a first-class concept: :func:`freeze` puts a model in ``eval()`` with no
gradients, and the trainer never hands its parameters to the optimiser. In the self-paired LoRA
setting the junior *is* the senior's base weights with the adapter disabled (:class:`AdapterOff`),
so no second copy is held.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from tandem_rlvr.errors import ModelLoadError  # noqa: F401 (raised here; also importable from here)
from tandem_rlvr.world.registry import WORLDS, find_model_alias

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The built-in worlds' model aliases (world:senior, world:junior, arith:*, shorthand:*), from their records.
WORLD_MODELS = tuple(a for w in WORLDS.values() for a in w.model_aliases)


def resolve_name(name: str) -> str:
    """Map a built-in world's model alias (``world:senior`` / ``world:junior`` for the arith world,
    ``shorthand:senior`` ...: :data:`WORLD_MODELS`) to its cached directory, building the world if needed."""
    found = find_model_alias(name)
    if found is None:
        return name
    from tandem_rlvr.world.build import build_world

    world, role = found
    paths = build_world(world=world.name)
    return str(paths.senior_dir if role == "senior" else paths.junior_dir)


def check_exists(name: str, role: str) -> None:
    if not name:
        raise ModelLoadError(f"no {role} model given")
    p = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not p.exists():
        raise ModelLoadError(f"{role} model path {name!r} does not exist")
    if p.is_dir() and not (p / "config.json").exists() and not any(p.glob("*.gguf")):
        raise ModelLoadError(f"{role} model directory {name!r} has no config.json")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt",
                   "spiece.model", "tekken.json")


# what transformers' refusal of a model's own code says (its hint, to trust the remote code, is on a later line)
_REMOTE_CODE_WORDS = ("contains custom code", "trust_remote_code=true")
REMOTE_CODE_HINT = ("its code runs only if you trust it: pass --trust-remote-code to eval, or set "
                    "model.trust_remote_code: true in a training config")


def load_error_text(e: BaseException, name: str) -> str:
    """The first line of a loader's error, and a hint when ``name`` is no local path (a hub name) or the model
    needs its own code (transformers' ``trust_remote_code``), in our options' words."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    if any(w in str(e).lower() for w in _REMOTE_CODE_WORDS):
        first = f"{first.rstrip(' .')}; {REMOTE_CODE_HINT}"
    if not Path(name).expanduser().exists():
        return f"{first} ({name!r} is not a local path, so it was looked up on the Hugging Face hub)"
    return first


def hub_kwargs(name: str, revision: str | None, role: str) -> dict:
    """``{"revision": revision}`` for a hub name; nothing for a local directory, which has no revisions
    (``model.revision`` set anyway is ignored with a warning: a config meant for the hub, pointed at a copy)."""
    if not revision:
        return {}
    if Path(name).expanduser().exists():
        log.warning("%s: revision %r ignored: %r is a local directory", role, revision, name)
        return {}
    return {"revision": revision}


SNAPSHOT_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken")  # what an engine reads of a model


def local_snapshot(name: str, revision: str | None = None, *, role: str = "senior", code: bool = False) -> str:
    """``name`` as a local folder, for what reads a model's files itself (the vLLM engines): a local path as it is,
    a hub name as its snapshot at ``revision`` in the Hugging Face cache (fetched once where the hub is reachable,
    else the cached one: ``HF_HUB_OFFLINE``), with its weights, configs and tokenizer files (``code``: also its
    Python files, for ``trust_remote_code``); else raise naming ``name``."""
    if not name or Path(name).expanduser().exists():
        return str(Path(name).expanduser()) if name else name
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, revision=revision or None,
                                 allow_patterns=list(SNAPSHOT_FILES) + (["*.py"] if code else []))
    except Exception as e:  # huggingface_hub raises many types (offline, unknown repo or revision, network)
        raise ModelLoadError(f"{role} model {name!r}{f' at revision {revision!r}' if revision else ''}: no local "
                             f"copy for the vLLM engine: {load_error_text(e, name)}") from None


def load_tokenizer(name: str, *, trust_remote_code: bool = False, role: str = "senior", revision: str | None = None):
    """Load a tokenizer (left padding; pad falls back to EOS) or raise naming ``name`` (``revision``: a hub
    branch, tag or commit)."""
    from transformers import AutoTokenizer

    name = resolve_name(name)
    check_exists(name, role)
    p = Path(name).expanduser()
    if p.is_dir() and not any((p / f).exists() for f in TOKENIZER_FILES) and not any(p.glob("*.gguf")):
        raise ModelLoadError(f"{role} model directory {name!r} has no tokenizer files "
                             f"(none of {', '.join(TOKENIZER_FILES[:2])}, ...)")
    try:
        tok = AutoTokenizer.from_pretrained(str(p) if p.exists() else name, trust_remote_code=trust_remote_code,
                                            **hub_kwargs(name, revision, role))
    except Exception as e:  # transformers raises many types here
        raise ModelLoadError(f"could not load the {role} tokenizer from {name!r}: {load_error_text(e, name)}") from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelLoadError(f"{role} tokenizer {name!r} has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name: str, *, dtype: str = "float32", trust_remote_code: bool = False, role: str = "senior",
                   revision: str | None = None, attn_implementation: str | None = None):
    """Load a causal LM from a local path or hub name (at ``revision``), or raise naming ``name`` and the cause.
    ``attn_implementation`` (eager, sdpa, flash_attention_2, ...; empty = transformers' default) goes to
    ``from_pretrained``, which refuses one the model or the machine cannot run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    name = resolve_name(name)
    check_exists(name, role)
    path = str(Path(name).expanduser()) if Path(name).expanduser().exists() else name
    hub = hub_kwargs(name, revision, role)
    attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
    except Exception as e:
        raise ModelLoadError(f"could not read the {role} model config from {name!r}: {load_error_text(e, name)}") from None
    _warn_pickled(path, role, name)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, use_safetensors=None,
            output_loading_info=True, **hub, **attn
        )
    except ValueError as e:
        raise ModelLoadError(
            f"{role} model {name!r} (model_type={getattr(config, 'model_type', '?')!r}) is not a causal LM "
            f"that transformers can load: {str(e).splitlines()[0]}"
        ) from None
    except Exception as e:
        raise ModelLoadError(f"could not load the {role} model from {name!r}: {load_error_text(e, name)}") from None
    _check_loaded(info, role, name)
    return model


PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")


def _warn_pickled(path: str, role: str, name: str) -> None:
    """A local model folder whose weights are pickled only (``pytorch_model.bin``, no ``*.safetensors``): loaded
    (transformers unpickles them with ``torch.load(weights_only=True)``), with a warning that says so. No option
    refuses them: a checkpoint of an older transformers is often pickled only."""
    p = Path(path)
    if not p.is_dir() or any(p.glob("*.safetensors")):
        return
    pickled = sorted(f.name for pattern in PICKLED_WEIGHTS for f in p.glob(pattern))
    if pickled:
        log.warning("%s model %r has pickled weights only (%s), no safetensors: they are loaded with "
                    "torch.load(weights_only=True); prefer a safetensors copy (load it and save_pretrained it once)",
                    role, name, ", ".join(pickled[:3]) + (", ..." if len(pickled) > 3 else ""))


def _check_loaded(info: dict, role: str, name: str) -> None:
    """transformers initialises at random the weights a checkpoint lacks and drops the ones the model has no
    place for, with a printed report only: a model built partly at random would generate and train without an
    error, so either is one. Tied weights (``lm_head`` with ``tie_word_embeddings``) are not missing."""
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(str(k) for k in info.get(kind) or ())
        if keys:
            shown = ", ".join(keys[:4]) + (f", ... ({len(keys)} in all)" if len(keys) > 4 else "")
            what = {"missing_keys": "lacks weights the model needs (they would be random)",
                    "unexpected_keys": "holds weights the model has no place for (they would be dropped)",
                    "mismatched_keys": "holds weights of the wrong shape (they would be random)"}[kind]
            raise ModelLoadError(f"{role} model {name!r}: the checkpoint {what}: {shown}; is it complete, "
                                 "and of this config's architecture?")


def freeze(model):
    """Make ``model`` a frozen partner: eval mode, no gradients. Returns it."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def enable_gradient_checkpointing(model):
    """Recompute each decoder layer's activations in the backward instead of keeping them (transformers'
    ``gradient_checkpointing_enable`` with non-reentrant ``torch.utils.checkpoint``). Returns ``model``.

    For the trained senior only (``model.gradient_checkpointing``): it costs one more forward of every layer
    per backward and keeps one layer's input instead of all of its activations (docs/scale-out.md). It acts in
    ``train()`` mode only, so the rollouts and validation (``eval()``, with a KV cache) are unchanged; the
    update's forwards pass ``use_cache=False``, and the model's ``config.use_cache`` (saved with its
    checkpoints) is left alone. Non-reentrant checkpointing gives gradients to a LoRA adapter whose inputs come
    from frozen embeddings, and composes with FSDP2 (its pre-backward hook re-gathers a layer for the
    recompute). A peft model is enabled on its base model, in place.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ModelLoadError(f"{type(base).__name__} does not support gradient checkpointing; "
                             "set model.gradient_checkpointing: false")
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in base.modules():  # the recompute runs in the backward, outside the forward's attention switch
        func = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and func is not None:
            module._gradient_checkpointing_func = _replay_attention(func, base.config)
    return model


def _replay_attention(checkpoint_func, config):
    """``checkpoint_func`` whose recompute uses the attention implementation its forward used.

    The training forwards switch ``config._attn_implementation`` for their own block
    (:func:`~tandem_rlvr.engines.fastpath.gqa_attention`, CPU); the recompute runs later, in the backward, and
    would otherwise take transformers' path, which saves differently shaped tensors (a CheckpointError)."""

    def run(function, *args, **kwargs):
        impl = config._attn_implementation

        def replay(*a, **kw):
            now = config._attn_implementation
            if now == impl:
                return function(*a, **kw)
            config._attn_implementation = impl
            try:
                return function(*a, **kw)
            finally:
                config._attn_implementation = now

        return checkpoint_func(replay, *args, **kwargs)

    return run


def check_tokenizers(senior_tok, junior_tok, senior_name: str, junior_name: str) -> None:
    """Senior and junior must map every token string to the same id; else raise naming both."""
    vs, vj = senior_tok.get_vocab(), junior_tok.get_vocab()
    if vs == vj:
        return
    only_s = len(set(vs) - set(vj))
    only_j = len(set(vj) - set(vs))
    moved = sum(1 for k, v in vs.items() if k in vj and vj[k] != v)
    raise ModelLoadError(
        f"tokenizers of senior {senior_name!r} ({len(vs)} tokens) and junior {junior_name!r} ({len(vj)} tokens) "
        f"are not compatible: {only_s} tokens only in the senior's, {only_j} only in the junior's, "
        f"{moved} with different ids. Tandem decoding needs the same vocabulary ids; for step-level handoffs "
        "between different tokenizers set model.bridge: true (text bridge)."
    )


def eos_ids(tokenizer, model=None) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation-config EOS."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gc = getattr(model, "generation_config", None)
    e = getattr(gc, "eos_token_id", None) if gc is not None else None
    if isinstance(e, int):
        ids.add(e)
    elif isinstance(e, (list, tuple)):
        ids.update(int(x) for x in e)
    if not ids:
        raise ModelLoadError("the tokenizer has no EOS token; responses could never end")
    return sorted(ids)


def junior_eos_ids(tokenizer, senior, junior, junior_tokenizer=None) -> list[int] | None:
    """The ids that end a row where the junior writes them, or None where they are the senior's
    (:func:`eos_ids`). A junior of the senior's vocabulary may end on other tokens: a base model and an instruct
    model of one family (Llama 3: ``<|end_of_text|>`` and ``<|eot_id|>``; Qwen2.5: ``<|endoftext|>`` and
    ``<|im_end|>``). Its own tokenizer's EOS (``junior_tokenizer``, else the shared one) and its generation config's
    count, as the senior's do for the senior."""
    if junior is None or isinstance(junior, AdapterOff):  # no junior, or the senior itself with its adapter off
        return None
    mine = eos_ids(junior_tokenizer or tokenizer, junior if hasattr(junior, "generation_config") else None)
    return None if mine == eos_ids(tokenizer, senior) else mine


class AdapterOff:
    """A peft model seen with its adapter disabled: the frozen base model, without a second copy."""

    def __init__(self, peft_model):
        self.peft_model = peft_model

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)

    def get_output_embeddings(self):
        return self.peft_model.get_output_embeddings()

    @property
    def config(self):
        return self.peft_model.config

    def parameters(self):
        return (p for n, p in self.peft_model.named_parameters() if "lora_" not in n)


@dataclass
class Pair:
    """The loaded senior (trainable), junior (frozen) and their shared tokenizer."""

    senior: object
    junior: object
    tokenizer: object
    lora: bool = False
    junior_tokenizer: object = None  # set only for a text-bridged junior with its own vocabulary
    junior_eos: tuple = ()  # a junior of the same vocabulary ending on other ids than the senior (junior_eos_ids)


def _apply_lora(model, mcfg):
    from peft import LoraConfig, get_peft_model

    _check_tied_targets(model, mcfg)
    lcfg = LoraConfig(r=mcfg.lora_r, lora_alpha=mcfg.lora_alpha, target_modules=list(mcfg.lora_targets),
                      lora_dropout=0.0, task_type="CAUSAL_LM")
    return get_peft_model(model, lcfg)


def _check_tied_targets(model, mcfg) -> None:
    """Refuse a LoRA on the input or output embeddings of a model that ties them (one matrix read twice): the adapter
    would change one of the two reads only, a model that the merged copy every engine and saved folder gets (the
    adapter in the shared matrix, so in both reads) is not."""
    emb_in, emb_out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb_out is None or getattr(emb_in, "weight", None) is not getattr(emb_out, "weight", 0):
        return
    names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if mod is emb_in or mod is emb_out}
    hit = sorted(names & set(mcfg.lora_targets))
    if hit:
        raise ModelLoadError(f"model.lora_targets includes {hit[0]!r}, but senior {mcfg.senior!r} ties its input and "
                             f"output embeddings (one matrix): a LoRA there would train a model that its merged copy "
                             f"(the vLLM engine's, final/) is not; leave {', '.join(sorted(names))} out of "
                             "model.lora_targets")


def load_pair(mcfg) -> Pair:
    """Load senior, junior and tokenizer from a :class:`~tandem_rlvr.config.ModelConfig` (each model at its
    revision, both with ``model.attn_implementation``)."""
    trc, attn = mcfg.trust_remote_code, mcfg.attn_implementation
    tok = load_tokenizer(mcfg.senior, trust_remote_code=trc, role="senior", revision=mcfg.revision)
    senior = load_causal_lm(mcfg.senior, dtype=mcfg.dtype, trust_remote_code=trc, role="senior",
                            revision=mcfg.revision, attn_implementation=attn)
    jdtype = getattr(mcfg, "junior_dtype", "") or mcfg.dtype
    junior_eos: tuple = ()  # a self-paired junior ends where the senior does
    if mcfg.self_paired:
        if mcfg.lora_r > 0:
            senior = _apply_lora(senior, mcfg)
            return Pair(senior, AdapterOff(senior), tok, lora=True)
        junior = freeze(cast_parameters(copy.deepcopy(senior), DTYPES[jdtype]))
    else:
        jtok = load_tokenizer(mcfg.junior, trust_remote_code=trc, role="junior", revision=mcfg.junior_revision)
        junior = freeze(load_causal_lm(mcfg.junior, dtype=jdtype, trust_remote_code=trc, role="junior",
                                       revision=mcfg.junior_revision, attn_implementation=attn))
        if mcfg.lora_r > 0:
            senior = _apply_lora(senior, mcfg)
        if getattr(mcfg, "bridge", False):
            return Pair(senior, junior, tok, lora=mcfg.lora_r > 0, junior_tokenizer=jtok)
        check_tokenizers(tok, jtok, mcfg.senior, mcfg.junior)
        junior_eos = tuple(junior_eos_ids(tok, senior, junior, jtok) or ())
    _check_rows(senior, junior, tok, mcfg)
    return Pair(senior, junior, tok, lora=mcfg.lora_r > 0, junior_eos=junior_eos)


def cast_parameters(model, dtype: torch.dtype):
    """``model`` with its floating-point parameters in ``dtype`` and its buffers left as they are: what loading it in
    ``dtype`` gives. ``Module.to(dtype)`` would also cast the float32 buffers a model keeps on purpose (RoPE's
    ``inv_freq``: in bf16 its angles drift with the position), so a bf16 copy of a senior would not compute what
    the same weights loaded in bf16 (the vLLM engine's junior) compute."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


def _check_rows(senior, junior, tok, mcfg) -> None:
    rs = senior.get_output_embeddings().weight.shape[0]
    rj = junior.get_output_embeddings().weight.shape[0]
    if rs != rj:
        fix = (f"; their tokenizer has {len(tok)} ids, so the rows past it are padding no text encodes: save the model "
               f"with {max(rs, rj)} rows cut to {min(rs, rj)} (transformers' model.resize_token_embeddings({min(rs, rj)}), "
               "then save_pretrained) and train with that copy (`tandem-rlvr eval` audits such a pair as it is)"
               if len(tok) <= min(rs, rj) else "")
        raise ModelLoadError(f"senior {mcfg.senior!r} has {rs} output rows but junior {mcfg.junior!r} has {rj}; their "
                             f"logits cannot be compared token by token{fix}")
    check_output_rows(senior, tok, mcfg.senior, "senior")


def check_output_rows(model, tok, name: str, role: str = "senior") -> None:
    """``model``'s output layer has a row for every id of its tokenizer ``tok``; else a token it encodes (an added
    token, another model's tokenizer) would index past the embeddings: raise naming the model and both sizes."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    rows = getattr(getattr(out, "weight", None), "shape", (None,))[0]
    if rows is not None and len(tok) > rows:
        raise ModelLoadError(f"{role} model {name!r}: its tokenizer has {len(tok)} tokens but its output layer only "
                             f"{rows} rows (ids >= {rows} have none): give the model its own tokenizer, or resize its "
                             "embeddings to the tokenizer's length and save it")
