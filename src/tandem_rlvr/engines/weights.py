"""The trained senior's weights as a rollout engine loads them: ``(name, tensor)`` under the checkpoint's names.

One iterator for every way the trainer holds the senior:

- a plain (DDP) model: its parameters as they are;
- a peft model: the adapter added to each weight it adapts (out of place), under the base model's names;
- an FSDP2-sharded model (``train.fsdp`` full or zero2): streamed one FSDP unit at a time (the root's own
  parameters, then each decoder layer's): the unit is gathered, copies of its full tensors are handed
  out in the engine's dtype, the unit is resharded, the next one follows. A process never holds more
  than its shard plus the unit being loaded (and the copies the loader has not consumed yet), never a
  full copy of the model. Collective: every process must exhaust the iterator, in the same order.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["engine_weights", "is_sharded", "fsdp_units", "safetensors_files"]

INDEX = "model.safetensors.index.json"


def safetensors_files(folder: str | Path, what: str = "model") -> list[Path]:
    """The safetensors files that hold a saved model's weights, as transformers reads them: those its index
    (``model.safetensors.index.json``) maps, else ``model.safetensors``, else every ``*.safetensors`` (a folder may
    also hold other files, a ``consolidated.safetensors`` copy for another loader: read once, they would load every
    weight twice). Raise naming ``what`` and ``folder`` where there are none, or an indexed file is missing."""
    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise FileNotFoundError(f"{what} {str(folder)!r}: unreadable {INDEX} ({e})") from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{what} {str(folder)!r}: {INDEX} names {missing[0]!r}, which is not there")
        return [folder / n for n in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{what} {str(folder)!r} has no *.safetensors weights")
    return files


def is_sharded(model) -> bool:
    """Whether ``model`` is sharded with FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return False
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def engine_weights(model, dtype: torch.dtype | None = None) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The model's weights under the names vLLM loads, cast to ``dtype`` (None: as they are).

    A plain LoRA adapter is added to each weight it adapts as that weight is handed out (``W + ΔW``, peft's own
    ``get_delta_weight``, the arithmetic of its merge): the model itself is never modified. Another peft adapter
    (DoRA, a LoRA bias, ...) is merged in while the block is open and unmerged after, which rounds the base weights
    (in bfloat16 by up to one unit in the last place per sync); a sharded model is streamed unit by unit (see the
    module's doc)."""
    peft = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
    layers = _plain_lora_layers(model) if peft else None
    in_place = peft and layers is None
    if in_place:
        model.merge_adapter()
    try:
        source = _streamed(model, dtype) if is_sharded(model) else _plain(model, dtype, layers or {})
        yield _renamed(source, peft=peft)
    finally:
        if in_place:
            model.unmerge_adapter()


def _plain_lora_layers(model) -> dict | None:
    """``{parameter name of an adapted weight: its LoRA layer}`` when every LoRA layer of the peft ``model`` is
    plain LoRA (no variant such as DoRA, no LoRA bias, not merged), else None."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return None
    layers = {}
    for name, m in model.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        active = [a for a in m.active_adapters if a in m.lora_A or a in getattr(m, "lora_embedding_A", {})]
        if m.merged or any(a in getattr(m, "lora_variant", {}) or getattr(m, "lora_bias", {}).get(a) for a in active):
            return None
        if active:
            layers[f"{name}.base_layer.weight"] = (m, active)
    return layers


def _plain(model, dtype, lora: dict):
    for name, p in model.named_parameters():
        w = p.detach()
        if name in lora:  # W + ΔW, as peft's merge adds it (in W's dtype), out of place
            layer, active = lora[name]
            with torch.no_grad():
                for a in active:  # in the promoted dtype, rounded once to W's (as peft's in-place +=)
                    w = (w + layer.get_delta_weight(a)).to(p.dtype)
        yield name, w if dtype in (None, w.dtype) else w.to(dtype)


def _streamed(model, dtype):
    for prefix, unit, names in fsdp_units(model):
        unit.unshard()
        try:
            for name in names:  # copies: a loader may hold them after the unit is resharded
                p = unit.get_parameter(name).detach()
                yield prefix + name, p.to(dtype or p.dtype, copy=True)
        finally:
            unit.reshard()


def fsdp_units(model) -> list[tuple[str, object, list[str]]]:
    """``(qualified prefix, FSDP unit, names of the parameters the unit itself manages)``, root first."""
    from torch.distributed.fsdp import FSDPModule

    units = [(n, m) for n, m in model.named_modules() if isinstance(m, FSDPModule)]
    out = []
    for name, unit in units:
        inner = [(other[len(name) + 1:] if name else other) + "." for other, _ in units
                 if other != name and (not name or other.startswith(name + "."))]
        own = [n for n, _ in unit.named_parameters() if not any(n.startswith(i) for i in inner)]
        out.append((name + "." if name else "", unit, own))
    return out


def _renamed(source, peft: bool):
    for name, tensor in source:
        if peft:
            if "lora_" in name or "original_module" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = name.replace("modules_to_save.default.", "")
        yield name.replace("_checkpoint_wrapped_module.", ""), tensor
