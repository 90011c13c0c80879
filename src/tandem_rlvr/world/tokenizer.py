"""Train a small byte-level BPE tokenizer locally and save it as a standard Hugging Face tokenizer.

The tokenizer has word-start markers (byte-level ``Ġ``), a ChatML-style chat template and the
special tokens ``<|endoftext|>`` (pad), ``<|im_start|>`` and ``<|im_end|>`` (EOS of an assistant
turn), so that the library runs the same code path for it as for a real Qwen-family model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# A Qwen2-style split: one digit per token (a leading space may attach to the first digit, as the
# word-start marker), and newlines glued onto the punctuation before them (so ".\n\n" can be one
# token, as in Qwen's vocabulary).
DIGIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    out_dir: str | Path | None = None,
    pattern: str | None = None,
    extra_tokens: Sequence[str] = (),
):
    """Train a byte-level BPE on ``corpus``; return a ``PreTrainedTokenizerFast`` (saved if ``out_dir``).

    ``pattern``: an optional pre-tokenizer split regex (e.g. ``DIGIT_PATTERN``) applied before the
    byte-level mapping; by default the GPT-2 byte-level split is used.
    ``extra_tokens``: literal strings added whole as (non-special) tokens, e.g. a constant prompt
    instruction, so that it costs one position instead of dozens.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",  # an init kwarg, so that it is saved (setting the attribute is not)
    )
    if extra_tokens:
        fast.add_tokens([AddedToken(t, normalized=False, special=False) for t in extra_tokens])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast
