"""What the vLLM tests share: a tokenizer under which ".\\n\\n" is one token, two tiny untied models, a tiny
tied one and an optimizer step that moves all its weights, prompts, the in-process reference and the comparison of
two rollouts."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_models import CORPUS, GLUE_NL
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.vllm_backend import vllm_available

PROBLEMS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5. How many are left?", "hi", "6 times 7?",
            "The quick brown fox", "First we multiply"]
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")


@pytest.fixture(scope="module")
def tok():
    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=320, pattern=GLUE_NL)  # ".\n\n" is one token here


def vllm_model(tok, seed: int):
    """A tiny untied Qwen2 (head_dim 32, which vLLM's CPU attention supports) that ends steps often."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.normal_(0, 0.5)
        for i in range(len(tok)):
            if tok.decode([i]).endswith("\n"):
                m.lm_head.weight[i] *= 4.0
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    return m


def tied_vllm_model(tok, seed: int, arch: str = "qwen3"):
    """A tiny senior whose output layer is its input embedding (``tie_word_embeddings``, as Qwen3-0.6B/4B and
    SmolLM2): a Qwen3 (head_dim 32, q/k norms) or a Llama. The embedding (std 0.05) is wider than the default so that
    greedy picks are decisive, yet small enough that one :func:`optimizer_step` changes it as much as the body (a
    stale output layer then flips the first greedy token of every prompt); the norms are random so that a stale
    norm would show."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    m = Qwen3ForCausalLM(Qwen3Config(head_dim=32, **kw)) if arch == "qwen3" else LlamaForCausalLM(LlamaConfig(**kw))
    m.eval()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    with torch.no_grad():
        m.model.embed_tokens.weight.normal_(0, 0.05)
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    return m


def optimizer_step(model, ids: list[int], lr: float = 0.1):
    """A copy of ``model`` after one AdamW step on the next-token loss of ``ids``: every parameter moves (checked),
    the shared embedding of a tied model included."""
    import copy

    new = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(new.parameters(), lr=lr, weight_decay=0.0)
    x = torch.tensor([ids])
    new(x, labels=x).loss.backward()
    opt.step()
    new.eval().zero_grad(set_to_none=True)
    still = [n for (n, a), b in zip(model.named_parameters(), new.parameters()) if torch.equal(a, b)]
    assert not still, f"the step left {still} unchanged"
    return new


@pytest.fixture(scope="module")
def pair(tok):
    return vllm_model(tok, 0), vllm_model(tok, 1)


@pytest.fixture(scope="module")
def batch(tok):
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in PROBLEMS]
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def in_process(tok, pair, batch, schedule, sampling, **kw):
    """The in-process engine's rollout of ``batch``: the reference the vLLM engines must reproduce."""
    return generate(pair[0], pair[1] if schedule.name != "none" else None, *batch, schedule, sampling,
                    eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, record_junior=False, **kw)


def assert_same(ref, got):
    T = ref.response_ids_BT.shape[1]
    assert got.response_ids_BT.shape[1] == T
    assert torch.equal(ref.response_ids_BT, got.response_ids_BT)
    assert torch.equal(ref.response_mask_BT.long(), got.response_mask_BT.long())
    assert torch.equal(ref.owner_BT.long(), got.owner_BT.long())
    assert torch.equal(ref.rounds_B.long(), got.rounds_B.long())
    assert torch.equal(ref.finished_B.bool(), got.finished_B.bool())

