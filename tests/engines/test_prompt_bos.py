"""A base model without a chat template whose tokenizer adds a BOS by default (as Gemma's and Llama's do): every
prompt the package encodes (solo sampling and training: ``encode_prompts``; the text bridge: ``encode_texts``; bits
per byte: ``legibility._rows``) starts with that BOS, once, as ``tokenizer(prompt)`` gives it; the text the authors
write after the prompt gets none. With a chat template (it writes its own BOS) or without a BOS nothing changes."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_models import make_tiny_model
from tandem_rlvr.data import Example, encode_prompts, render_prompt
from tandem_rlvr.engines import turns
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.evaluation.legibility import _rows

EXAMPLES = [Example("0", "What is 3 plus 4?", "7"), Example("1", "6 times 7?", "42")]


def _fast(tokenizer, bos: bool, chat_template: str | None = None):
    """A copy of the tests' tokenizer without its chat template, with a ``<bos>`` post-processor where ``bos``."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    kw = {}
    if bos:
        t.add_special_tokens(["<bos>"])
        t.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", t.token_to_id("<bos>"))])
        kw["bos_token"] = "<bos>"
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token, **kw)
    tok.chat_template = chat_template
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def bos_tok(tokenizer):
    tok = _fast(tokenizer, bos=True)
    assert tok.bos_token_id is not None and not tok.chat_template
    assert tok("x")["input_ids"][0] == tok.bos_token_id != tok("x", add_special_tokens=False)["input_ids"][0]
    return tok


def test_plain_prompts_start_with_the_bos_the_tokenizer_adds(bos_tok):
    texts = [render_prompt(bos_tok, ex.problem) for ex in EXAMPLES]
    default = bos_tok(texts)["input_ids"]  # what the model saw in pretraining: BOS, then the text
    assert all(ids[0] == bos_tok.bos_token_id and ids.count(bos_tok.bos_token_id) == 1 for ids in default)
    assert encode_prompts(bos_tok, EXAMPLES)[1] == default
    assert turns.encode_texts(bos_tok, texts) == default
    rows = _rows(bos_tok, texts, [" 7", " 42"], None)
    assert [r["ids"][:len(d)] for r, d in zip(rows, default)] == default
    assert [r["first"] for r in rows] == [len(d) for d in default]  # the text's tokens are scored, not the BOS
    # a prompt whose text already starts with the BOS gets no second one
    assert turns.encode_texts(bos_tok, ["<bos>" + texts[0]]) == [default[0]]


def test_a_chat_template_or_a_tokenizer_without_bos_gets_no_bos_added(tokenizer, bos_tok):
    chat = _fast(tokenizer, bos=True, chat_template="{{ messages[0]['content'] }}")
    plain = _fast(tokenizer, bos=False)
    for tok in (chat, plain):
        texts = [render_prompt(tok, ex.problem) for ex in EXAMPLES]
        bare = tok(texts, add_special_tokens=False)["input_ids"]
        assert encode_prompts(tok, EXAMPLES)[1] == bare and turns.encode_texts(tok, texts) == bare


def test_the_bridge_reads_one_bos_before_the_prompt_and_none_in_the_text(bos_tok, monkeypatch):
    """Each turn's input (the author's prompt, then its encoding of the text so far) holds the BOS once, first."""
    seen = []
    decode = turns.decode_turn
    monkeypatch.setattr(turns, "decode_turn", lambda side, seqs, *a: seen.extend(seqs) or decode(side, seqs, *a))
    sides = tuple(turns.make_side(make_tiny_model(len(bos_tok), s, 32), bos_tok, [bos_tok.eos_token_id]) for s in (0, 1))
    prompts = turns.encode_texts(bos_tok, [render_prompt(bos_tok, ex.problem) for ex in EXAMPLES])
    schedule = make_schedule("word", bos_tok, p=0.5, max_gap=3)
    chains = turns.start_chains(schedule, schedule.coins(len(EXAMPLES), 0), 12)
    turns.run_turns(sides, (prompts, prompts), chains, Sampling(max_new_tokens=12, temperature=1.0),
                    torch.Generator().manual_seed(0), turns.TurnRules())
    assert len(seen) > len(EXAMPLES), "want turns after the first"
    assert all(s[0] == bos_tok.bos_token_id and s.count(bos_tok.bos_token_id) == 1 for s in seen)
