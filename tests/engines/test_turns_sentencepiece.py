"""The turn driver with a Llama-2/Mistral-style SentencePiece tokenizer (a ``"▁"`` word marker and a decoder that
strips the text's first space): a turn decoded on its own would lose the space of its first ``"▁word"`` token and
glue words (and numbers: ``"4" + "▁7x"`` -> ``"47x"``) at every handoff. The chain text must be the decoding of the
whole token sequence the authors wrote."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_models import CORPUS, make_tiny_model
from tandem_rlvr.data import render_prompt
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.turns import TurnRules, decode_after, encode_texts, make_side, run_turns, start_chains
from tandem_rlvr.engines.types import Sampling

PROBLEMS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many are left?", "6 times 7?", "hi"]


@pytest.fixture(scope="module")
def sp_tokenizer():
    """The Llama-2 / Mistral tokenizer.json layout, trained locally: normalizer Prepend("▁") + Replace(" ", "▁"),
    no pre-tokenizer, a decoder that turns "▁" into spaces and strips the first one (no byte tokens here, so that
    every emitted token is a piece of text)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "</s>"]))
    t.pre_tokenizer = None
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    tok.padding_side = "left"
    return tok


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_a_turn_decoded_after_its_context_keeps_the_space_of_its_first_word(sp_tokenizer):
    tok = sp_tokenizer
    ids = _ids(tok, "The answer is 4 7x")
    cut = next(k for k in range(1, len(ids)) if tok.decode(ids[:k]) == "The")
    assert tok.decode(ids[:cut]) + tok.decode(ids[cut:]) == "Theanswer is 4 7x"  # the glue, decoded alone
    assert decode_after(tok, _ids(tok, "The"), ids[cut:]) == " answer is 4 7x"
    four = _ids(tok, "4")
    assert decode_after(tok, four, _ids(tok, "7x")) == " 7x"
    assert decode_after(tok, [], ids) == "The answer is 4 7x"  # no context: the whole decoding


@pytest.mark.parametrize("name,params", [("word", {"max_gap": 3}), ("bernoulli", {})])
def test_the_chain_text_is_the_decoding_of_every_turns_tokens(sp_tokenizer, name, params):
    """Two authors with this tokenizer, as the evaluation's cross-tokenizer bridge runs them: each chain's text is
    ``decode(all turns' ids)``, with handoffs at ``"▁word"`` tokens among them."""
    tok = sp_tokenizer
    sides = (make_side(make_tiny_model(len(tok), 0, 48, arch="llama"), tok, [tok.eos_token_id]),
             make_side(make_tiny_model(len(tok), 1, 32, arch="llama"), tok, [tok.eos_token_id]))
    prompts = encode_texts(tok, [render_prompt(tok, p) for p in PROBLEMS])
    schedule = make_schedule(name, tok, p=0.5, **params)
    spaced = 0
    for seed in (1, 2):
        chains = start_chains(schedule, schedule.coins(len(PROBLEMS), seed), 40)
        run_turns(sides, (prompts, prompts), chains, Sampling(max_new_tokens=40, temperature=1.0),
                  torch.Generator().manual_seed(seed), TurnRules())
        for c in chains:
            whole = [i for _, ids in c.turns for i in ids]
            assert c.text == tok.decode(whole, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            spaced += sum(bool(ids) and tok.convert_ids_to_tokens(ids[0]).startswith("▁") for _, ids in c.turns[1:])
    assert spaced > 0, "want handoffs at a word that starts with a space"
