"""Tiny random causal LMs and the corpus of the fixture tokenizer (no hub, CPU)."""

from __future__ import annotations

import torch

CORPUS = [
    "What is 3 plus 4? Step 1: 3 + 4 = 7.\n\nSo the answer is \\boxed{7}.",
    "Tom has 12 apples and gives away 5. 12 - 5 = 7.\n\nThe answer is \\boxed{7}.",
    "Solve the following math problem step by step. Put your final answer inside \\boxed{}, "
    "like \\boxed{42} or \\boxed{\\frac{1}{2}}.",
    "First we multiply 6 by 7 to get 42.\n\nThen we add 8 to get 50.\n\nAnswer: \\boxed{50}",
    "The quick brown fox jumps over the lazy dog. Numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15.",
] * 20

# A Qwen2-like split (newlines glued onto the punctuation before them, so ".\n\n" can be one token):
# a vocabulary whose boundaries differ from the default byte-level split of the fixture tokenizer's.
GLUE_NL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_tiny_model(vocab_size: int, seed: int, hidden: int = 32, layers: int = 2, arch: str = "qwen2"):
    """A tiny random causal LM from a transformers config (≈ 30k–100k parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**kw)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**kw)).eval()


def bias_token(model, token_id: int, bias: float):
    """Add ``bias`` to one token's logit in every forward (e.g. make a model emit EOS early)."""

    def hook(_module, _inputs, output):
        output = output.clone()
        output[..., token_id] += bias
        return output

    model.get_output_embeddings().register_forward_hook(hook)
    return model


def save_vision_model(d, kind, tokenizer=None):
    """A tiny vision model (``kind``: vit or clip_vision), which is no causal LM, saved to ``d``."""
    from transformers import CLIPVisionConfig, CLIPVisionModel, ViTConfig, ViTModel

    small = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "image_size": 8, "patch_size": 4}
    model = ViTModel(ViTConfig(**small)) if kind == "vit" else CLIPVisionModel(CLIPVisionConfig(**small))
    model.save_pretrained(str(d))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(d))
    return d
