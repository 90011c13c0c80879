"""FSDP2 sharding of the senior (``train.fsdp``), done by the trainer with torch's ``fully_shard``.

Why not accelerate's FSDP or DeepSpeed launchers: accelerate only builds FSDP on accelerators (a CPU
launch silently falls back to independent processes), so that path cannot be tested here, and DeepSpeed
steps its optimizer inside ``backward``. Sharding the senior ourselves works the same under gloo on
CPU and NCCL on GPUs, under any multi-process launch (the shipped ``accelerate/ddp`` config, torchrun).

Modes: ``full`` reshards the parameters after every forward (parameters, gradients and AdamW states
sharded; ZeRO-3-like); ``zero2`` keeps them gathered from forward to backward (gradients and AdamW
states sharded; ZeRO-2-like, less communication, more memory).

Rollouts: sharded weights are gathered inside every forward, which would need every process to run
the same number of forwards, and a rollout stops when *its* rows are done. :func:`gathered` instead
all-gathers the senior's weights once (one collective, called by every process) and keeps them
gathered for the whole rollout or evaluation, so forwards run without collectives, as many as each
process needs; the weights are resharded afterwards. Training forwards (log-probs, loss) run sharded:
every process has the same number of rows and micro-batches, so the same number of forwards.

Checkpoints: full (unsharded) state dicts gathered on every process, written by the main process;
loaded on the main process and broadcast (``broadcast_from_rank0``), so ``final/``, ``best/`` and the
checkpoints' weights are plain HF directories as without sharding (the optimizer state in
``train_state.pt`` is keyed by parameter name; ``train.fsdp`` cannot change on resume).
"""

from __future__ import annotations

import contextlib

import torch

from tandem_rlvr.errors import TandemError
from tandem_rlvr.names import FSDP_MODES as MODES


def shard(model, mode: str, mixed_precision: str = "no"):
    """Apply ``fully_shard`` to every decoder layer and then to the whole model (in place); returns it.

    ``mixed_precision`` (accelerate's setting, ``no`` / ``bf16`` / ``fp16``): with a half type the
    weights are gathered and computed in it, gradients reduced in float32 and outputs returned in
    float32 (FSDP2's counterpart of the bf16 autocast accelerate gives an unsharded senior)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mode not in MODES or mode == "off":
        raise ValueError(f"fsdp mode must be full or zero2, got {mode!r}")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(mixed_precision))
    if half is None and str(mixed_precision) not in ("no", "None", "fp32"):
        raise ValueError(f"train.fsdp supports mixed precision no, bf16 or fp16, got {mixed_precision!r}")
    layer_mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32 if half else None)
    root_mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32 if half else None,
                                   output_dtype=torch.float32 if half else None)
    layers = _decoder_layers(model)
    reshard = mode == "full"
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard, mp_policy=layer_mp)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=root_mp)
    model.tandem_fsdp_reshard = reshard  # what gathered() restores
    return model


def _decoder_layers(model) -> list:
    """The repeated blocks of a transformers causal LM (``model.model.layers`` and the like)."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers"):
        node = model
        for attr in path.split("."):
            node = getattr(node, attr, None)
        if isinstance(node, torch.nn.ModuleList) and len(node):
            return list(node)
    raise TandemError(f"train.fsdp: cannot find the decoder layers of {type(model).__name__} "
                      "(looked for model.layers, model.decoder.layers, transformer.h, gpt_neox.layers)")


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _fsdp_modules(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model):
    """Keep a sharded model's weights gathered inside the block (forwards need no collectives there).

    Collective: every process must enter it (once). A no-op for an unsharded model."""
    if not is_sharded(model):
        yield model
        return
    mods = _fsdp_modules(model)
    model.set_reshard_after_forward(False, recurse=True)
    for m in mods:
        m.unshard()
    try:
        yield model
    finally:
        for m in mods:
            m.reshard()
        model.set_reshard_after_forward(model.tandem_fsdp_reshard, recurse=True)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model) -> dict:
    """The unsharded state dict on the main process (CPU tensors), ``{}`` elsewhere. Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True))
    if getattr(model.config, "tie_word_embeddings", False):  # gathered copies no longer share storage
        for key in getattr(model, "_tied_weights_keys", None) or ():
            state.pop(key, None)
    return state


def full_optim_state(model, optimizer) -> dict:
    """The unsharded optimizer state (keyed by parameter name) on the main process. Collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_model_state(model, state: dict, *, main: bool):
    """Load a full state dict read on the main process (others pass anything) into a sharded model.

    Returns the incompatible keys (missing / unexpected), so the caller can judge tied weights."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    return set_model_state_dict(model, state if main else {},
                                options=_options(broadcast_from_rank0=True, strict=False))


def load_optim_state(model, optimizer, state: dict, *, main: bool) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state if main else {}, options=_options(broadcast_from_rank0=True))
