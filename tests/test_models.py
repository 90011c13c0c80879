"""Model loading refuses bad models with one clear message naming the culprit (the model path, a directory
without config.json or tokenizer files, a model that is no causal LM, tokenizers that do not match, a
tokenizer with neither a pad nor an EOS token); never a bare traceback, never a hang."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from helpers.tiny_models import CORPUS, make_tiny_model
from helpers.tiny_models import save_vision_model as _save_vision_model
from tandem_rlvr.config import load_config
from tandem_rlvr.models import ModelLoadError, load_causal_lm, load_pair, load_tokenizer


def test_missing_model_paths_are_named(tmp_path, model_dirs):
    senior, junior = model_dirs
    missing = str(tmp_path / "no_such_model")
    cfg = load_config(None, [f"model.senior={missing}", f"model.junior={junior}"])
    with pytest.raises(ModelLoadError, match=rf"senior model path '{missing}' does not exist"):
        load_pair(cfg.model)
    cfg = load_config(None, [f"model.senior={senior}", f"model.junior={missing}"])
    with pytest.raises(ModelLoadError, match=rf"junior model path '{missing}' does not exist"):
        load_pair(cfg.model)
    # a directory without config.json
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ModelLoadError, match=r"senior model directory '.*empty_dir' has no config.json"):
        load_causal_lm(str(tmp_path / "empty_dir"))


def test_unknown_hub_name_offline_is_one_line():
    with pytest.raises(ModelLoadError) as e:
        load_tokenizer("no-such-org-xyz/no-such-model", role="junior")
    msg = str(e.value)
    assert "junior tokenizer from 'no-such-org-xyz/no-such-model'" in msg and "not a local path" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("kind", ["vit", "clip_vision"])
def test_non_causal_model_dir_is_refused(tmp_path, tokenizer, kind):
    d = _save_vision_model(tmp_path / kind, kind, tokenizer)
    with pytest.raises(ModelLoadError, match=rf"senior model '{d}' \(model_type='{kind}(_model)?'\) is not a causal LM"):
        load_causal_lm(str(d))


def test_model_dir_without_tokenizer_files_is_named(tmp_path, model_dirs):
    d = _save_vision_model(tmp_path / "vit_only", "vit")
    cfg = load_config(None, [f"model.senior={d}", f"model.junior={model_dirs[1]}"])
    with pytest.raises(ModelLoadError, match=rf"senior model directory '{d}' has no tokenizer files"):
        load_pair(cfg.model)


def test_senior_and_junior_with_different_vocabularies(tmp_path, model_dirs):
    from tandem_rlvr.world.tokenizer import build_tokenizer

    other = tmp_path / "other_vocab"
    corpus = ["alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"] * 30 + CORPUS[:2]
    tok2 = build_tokenizer(corpus, vocab_size=300, out_dir=other)
    make_tiny_model(len(tok2), seed=3).save_pretrained(str(other))
    cfg = load_config(None, [f"model.senior={model_dirs[0]}", f"model.junior={other}"])
    with pytest.raises(ModelLoadError, match=rf"tokenizers of senior '{model_dirs[0]}' .* and junior '{other}' .*"
                                             r"are not compatible: \d+ tokens only in the senior's"):
        load_pair(cfg.model)


def test_one_tokenizer_with_output_layers_of_two_sizes_names_the_fix(tmp_path, model_dirs, tokenizer):
    """Qwen2.5-7B (152,064 rows) with Qwen2.5-0.5B (151,936), one tokenizer: training refuses in one line that says
    the extra rows are padding and how to cut them; the model saved that way then loads as a pair."""
    padded = tmp_path / "padded_senior"
    V = len(tokenizer)
    model = make_tiny_model(V + 9, seed=0, hidden=48)
    model.save_pretrained(str(padded))
    tokenizer.save_pretrained(str(padded))
    cfg = load_config(None, [f"model.senior={padded}", f"model.junior={model_dirs[1]}"])
    with pytest.raises(ModelLoadError) as e:
        load_pair(cfg.model)
    msg = str(e.value)
    assert f"has {V + 9} output rows but junior" in msg and f"resize_token_embeddings({V})" in msg and "\n" not in msg
    model.resize_token_embeddings(V)  # the fix the message names
    model.save_pretrained(str(padded))
    pair = load_pair(cfg.model)
    assert pair.senior.get_output_embeddings().weight.shape[0] == V


def test_tokenizer_without_pad_falls_back_to_eos_and_without_either_is_refused(tmp_path, tokenizer):
    from transformers import Qwen2Config

    nopad, neither = tmp_path / "nopad", tmp_path / "neither"
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    for d in (nopad, neither):
        Qwen2Config(vocab_size=len(tokenizer)).save_pretrained(str(d))
    tok.save_pretrained(str(nopad))
    loaded = load_tokenizer(str(nopad))
    assert loaded.pad_token_id == loaded.eos_token_id == tokenizer.eos_token_id
    assert loaded.padding_side == "left"
    tok.eos_token = None
    tok.save_pretrained(str(neither))
    with pytest.raises(ModelLoadError, match=rf"senior tokenizer '{neither}' has neither a pad nor an EOS token"):
        load_tokenizer(str(neither))


# ------------------------------------------------------------------------------------------------
# degenerate outputs: empty responses, no EOS


# ------------------------------------------------------------------------------------------------
# the command line


def test_a_model_that_needs_its_own_code_says_which_option_runs_it(tmp_path, model_dirs):
    """transformers' refusal of a model's own code puts its hint (trust_remote_code=True) on a line after the
    first, which the one-line error keeps: the error names our options instead, and the code never runs."""
    import json
    import shutil

    from tandem_rlvr.preflight import check_model

    senior, _ = model_dirs
    d = tmp_path / "remote"
    shutil.copytree(senior, d)
    config = json.loads((d / "config.json").read_text())
    config.update(model_type="mytiny", auto_map={"AutoConfig": "cfg.MyCfg", "AutoModelForCausalLM": "mod.MyModel"})
    (d / "config.json").write_text(json.dumps(config))
    (d / "cfg.py").write_text("raise RuntimeError('the model code ran')\n")
    for load in (lambda: load_causal_lm(str(d)), lambda: check_model(str(d), "senior")):
        with pytest.raises(ModelLoadError) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and "custom code" in msg, msg
        assert "--trust-remote-code" in msg and "model.trust_remote_code: true" in msg, msg


def test_local_snapshot_reads_a_hub_model_from_the_cache_at_its_revision(tmp_path, monkeypatch):
    """What the vLLM engines read: a local path as it is; a hub id as its cached snapshot at the run's revision (the
    paper config names Qwen/Qwen3-4B-Instruct-2507; the dual engine read the junior's files from that name as a
    folder and failed); a missing one is one line naming the model and the revision."""
    from helpers.hub_cache import cache_hub_model

    from tandem_rlvr.models import local_snapshot

    cache_hub_model(tmp_path / "hub", monkeypatch, "tiny-org/tiny", {"main": "a" * 40, "v2": "b" * 40}, {"config.json": "{}"})
    main = local_snapshot("tiny-org/tiny")
    assert Path(main).name == "a" * 40 and (Path(main) / "config.json").read_text() == "{} main"
    assert Path(local_snapshot("tiny-org/tiny", "v2")).name == "b" * 40
    assert local_snapshot(str(tmp_path)) == str(tmp_path) and local_snapshot("") == ""
    with pytest.raises(ModelLoadError, match=r"junior model 'tiny-org/tiny' at revision 'v9': no local copy") as e:
        local_snapshot("tiny-org/tiny", "v9", role="junior")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelLoadError, match=r"senior model 'no-org/none': no local copy .*looked up on the Hugging"):
        local_snapshot("no-org/none")


def test_lora_on_tied_embeddings_is_refused_and_untied_ones_train(tmp_path, model_dirs, tokenizer):
    """A tied senior (one matrix for input and output embeddings): a LoRA on embed_tokens changes the lookup only,
    while the merged copy the engines and final/ get changes both reads: refused, naming the key; untied, it loads."""
    targets = 'model.lora_targets=["embed_tokens","q_proj"]'
    cfg = load_config(None, [f"model.senior={model_dirs[0]}", "model.self_paired=true", "model.lora_r=4", targets])
    with pytest.raises(ModelLoadError, match=r"model.lora_targets includes 'embed_tokens', but senior .* ties its "
                                             r"input and output embeddings") as e:
        load_pair(cfg.model)
    assert "\n" not in str(e.value) and "leave embed_tokens, lm_head out" in str(e.value)
    untied = tmp_path / "untied"
    m = make_tiny_model(len(tokenizer), seed=0, hidden=48)
    m.config.tie_word_embeddings = False
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())
    m.save_pretrained(str(untied))
    tokenizer.save_pretrained(str(untied))
    cfg = load_config(None, [f"model.senior={untied}", "model.self_paired=true", "model.lora_r=4", targets])
    assert load_pair(cfg.model).lora
    ok = load_config(None, [f"model.senior={model_dirs[0]}", "model.self_paired=true", "model.lora_r=4"])
    assert load_pair(ok.model).lora  # the default targets (attention projections) on the tied senior


def test_a_junior_that_ends_on_other_ids_keeps_them(tmp_path, model_dirs):
    """One vocabulary, other end-of-sequence ids (a base senior, an instruct junior): the pair records the junior's
    own (its generation config's and its tokenizer's), so its end of turn ends a row; the same ids record nothing."""
    import json
    import shutil

    from tandem_rlvr.models import AdapterOff, eos_ids, junior_eos_ids

    senior_dir, junior_dir = model_dirs
    pair = load_pair(load_config(None, [f"model.senior={senior_dir}", f"model.junior={junior_dir}"]).model)
    assert pair.junior_eos == () and junior_eos_ids(pair.tokenizer, pair.senior, pair.junior) is None
    other = tmp_path / "instruct"
    shutil.copytree(junior_dir, other)
    gen = json.loads((other / "generation_config.json").read_text()) if (other / "generation_config.json").exists() else {}
    (other / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [7]}))
    pair = load_pair(load_config(None, [f"model.senior={senior_dir}", f"model.junior={other}"]).model)
    assert pair.junior_eos == tuple(sorted({7, pair.tokenizer.eos_token_id}))
    assert 7 not in eos_ids(pair.tokenizer, pair.senior)
    assert junior_eos_ids(pair.tokenizer, pair.senior, AdapterOff(pair.senior)) is None
