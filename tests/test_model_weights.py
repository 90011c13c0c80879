"""A checkpoint that lacks weights, or holds weights the model has no place for, is refused: transformers would
initialise the missing ones at random and print a report only, so a partly random model would be evaluated or
trained without an error. Tied weights are not missing; pickled-only weights load with a warning."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.tiny_models import make_tiny_model
from tandem_rlvr.models import ModelLoadError, load_causal_lm


def _saved(tmp_path, tokenizer, name="m", **changes):
    model = make_tiny_model(len(tokenizer), seed=0)
    for k, v in changes.items():
        setattr(model.config, k, v)
    if changes.get("tie_word_embeddings") is False:  # its own lm_head, not the embeddings' tensor
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    d = tmp_path / name
    model.save_pretrained(str(d))
    return d, model


def _edit_weights(d, edit):
    path = d / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_tied_and_untied_complete_checkpoints_load_as_saved(tmp_path, tokenizer):
    for tie in (True, False):
        d, model = _saved(tmp_path, tokenizer, f"tie{tie}", tie_word_embeddings=tie)
        loaded = load_causal_lm(str(d))
        assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
        assert (loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()) == tie


def test_a_checkpoint_missing_a_layer_is_refused_naming_the_keys(tmp_path, tokenizer):
    d, _ = _saved(tmp_path, tokenizer)
    _edit_weights(d, lambda t: [t.pop(k) for k in [k for k in t if k.startswith("model.layers.1.")]])
    with pytest.raises(ModelLoadError, match=r"junior model .*lacks weights the model needs .*model\.layers\.1\."):
        load_causal_lm(str(d), role="junior")


def test_an_untied_checkpoint_without_its_lm_head_is_refused(tmp_path, tokenizer):
    d, _ = _saved(tmp_path, tokenizer, tie_word_embeddings=False)
    _edit_weights(d, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ModelLoadError, match=r"lacks weights .*lm_head\.weight"):
        load_causal_lm(str(d))


def test_a_checkpoint_with_weights_the_model_has_no_place_for_is_refused(tmp_path, tokenizer):
    d, _ = _saved(tmp_path, tokenizer)
    _edit_weights(d, lambda t: t.update({"model.layers.7.mlp.up_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(ModelLoadError, match=r"no place for .*model\.layers\.7\.mlp\.up_proj\.weight"):
        load_causal_lm(str(d))


def test_pickled_only_weights_load_with_a_warning(tmp_path, tokenizer, caplog):
    d, model = _saved(tmp_path, tokenizer)
    pickled, _ = _saved(tmp_path, tokenizer, "pickled")
    (pickled / "model.safetensors").unlink()
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")  # as transformers 4 wrote it
    assert (pickled / "pytorch_model.bin").is_file() and not list(pickled.glob("*.safetensors"))
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.models"):
        load_causal_lm(str(d))
        assert not caplog.records
        loaded = load_causal_lm(str(pickled))
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert any("pickled weights only (pytorch_model.bin)" in r.getMessage() for r in caplog.records)

