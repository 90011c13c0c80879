"""The CPU loop's fast paths (issue 37) compute what transformers computes:

- ``engines.lean_qwen3``: logits against ``Qwen3ForCausalLM``'s forward (prefill, decode steps, a
  multi-token window) on a random GQA Qwen3 with non-default RoPE theta and random q/k norms; whole
  rollouts on the built-in world's Qwen3s (greedy: same tokens, owners and decisions token for token,
  log-probs close) with the lean decoder on and off, lockstep and catch-up; finished rows dropped;
- ``engines.scoring`` with shared prompts: log-probs against the one-forward path; off under autograd
  in ``sequence_logps`` alone, and the same whatever the batch holds; read once under autograd by
  ``read_prompts`` (the update's path): the per-chunk gradient, all weights trained or a LoRA on q and v;
- ``TANDEM_RLVR_FASTPATH_OFF``: the switches it names are off, a typo is an error.
"""

import copy
import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tandem_rlvr.engines import fastpath, lean_qwen3
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.lean_qwen3 import LeanQwen3, supports
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.scoring import sequence_logps
from tandem_rlvr.engines.types import Rollout, Sampling
from helpers.tiny_models import bias_token, make_tiny_model


def _qwen3(**kw) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=1e6, pad_token_id=0,
               tie_word_embeddings=False, attn_implementation="sdpa")
    cfg.update(kw)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg)).eval()
    with torch.no_grad():  # norms away from their all-ones init, so a skipped or misplaced norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return model


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * max(scale, 1.0))


def _left_padded(B: int, P: int, V: int, seed: int = 0, lens=None):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(P // 3, P + 1, (B,), generator=g) if lens is None else torch.tensor(lens)
    lens[0] = P
    mask = (torch.arange(P)[None] >= (P - lens)[:, None]).long()
    ids = torch.randint(1, V, (B, P), generator=g).masked_fill(mask == 0, 0)
    return ids, mask


def test_supports_only_what_it_computes(tokenizer):
    assert supports(_qwen3())
    assert not supports(make_tiny_model(len(tokenizer), 0, 32))  # Qwen2 / Llama: transformers' path
    assert not supports(_qwen3(attention_bias=True))
    assert not supports(_qwen3(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}))
    assert not supports(_qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert supports(_qwen3(attention_dropout=0.1)) and not supports(_qwen3(attention_dropout=0.1).train())


def test_a_users_forward_hook_takes_transformers_path_and_its_own_hooks_do_not(tokenizer):
    """The lean decoder calls no module, so a hook that changes an output (here +2 on one logit) would be skipped:
    such a model takes transformers' path; the output-recording hooks transformers installs itself do not count."""
    model = _qwen3()
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True, output_attentions=True)
    assert any(m._forward_hooks for m in model.modules()), "transformers installed its recording hooks"
    assert supports(model)
    hooks = bias_token(model, 3, 2.0).get_output_embeddings()._forward_hooks
    assert not supports(model)
    hooks.clear()
    assert supports(model)
    pre = model.model.layers[0].register_forward_pre_hook(lambda mod, args: None)
    assert not supports(model)
    pre.remove()
    glob = torch.nn.modules.module.register_module_forward_hook(lambda mod, i, o: None)
    try:
        assert not supports(model)
    finally:
        glob.remove()
    assert supports(model)


def test_a_forward_under_autocast_takes_transformers_path(tokenizer):
    """Under model.mixed_precision=bf16 accelerate wraps the senior's forward in an autocast (and the trainer the
    junior's): the lean decoder, which calls no forward, would decode in float32 what the update computes in bf16."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from tandem_rlvr.training.build import junior_autocast

    senior, junior = _qwen3(), _qwen3()
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        acc = Accelerator(cpu=True, mixed_precision="bf16")
        senior = acc.prepare(senior)
        junior_autocast(acc, junior)
        assert not supports(acc.unwrap_model(senior)) and not supports(junior)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    plain = _qwen3()
    assert supports(plain)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not supports(plain)


def test_logits_match_transformers_prefill_decode_and_window():
    model = _qwen3()
    B, P, N = 5, 12, 9
    p_ids, p_mask = _left_padded(B, P, model.config.vocab_size)
    new = torch.randint(1, model.config.vocab_size, (B, N), generator=torch.Generator().manual_seed(1))
    ids, mask = torch.cat([p_ids, new], 1), torch.cat([p_mask, torch.ones(B, N, dtype=torch.long)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        lean = LeanQwen3(model, B, P + N, capacity=P + 1)  # the cache grows at the second decode step
        lean.set_padding(real)
        cols = torch.arange(P + N)
        causal = cols[None, :] <= cols[:, None]
        m4 = (real[:, None, None, :] & causal) | torch.eye(P + N, dtype=torch.bool)
        out = lean.forward(p_ids, pos[:, :P], m4[..., :P, :P], P)  # prefill
        _close(out[real[:, :P]], ref[:, :P][real[:, :P]])
        for t in range(P, P + 4):  # single-token decode steps (grouped-query attention, additive mask)
            _close(lean.forward(ids[:, t:t + 1], pos[:, t:t + 1], m4[..., t:t + 1, :t + 1], 1)[:, 0], ref[:, t])
        w = slice(P + 4, P + N)  # a multi-token window (catch-up)
        _close(lean.forward(ids[:, w], pos[:, w], m4[..., w, :P + N], N - 4), ref[:, w])


def test_prefill_of_repeated_prompts_reads_each_once():
    model = _qwen3()
    p_ids, p_mask = _left_padded(3, 10, model.config.vocab_size)
    inv = torch.tensor([0, 0, 1, 2, 2, 1])
    with torch.inference_mode():
        ref = model(input_ids=p_ids[inv], attention_mask=p_mask[inv],
                    position_ids=(p_mask[inv].cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
        lean = LeanQwen3(model, len(inv), 16)
        cols = torch.arange(10)
        m4 = (p_mask.bool()[:, None, None, :] & (cols[None, :] <= cols[:, None])) | torch.eye(10, dtype=torch.bool)
        out = lean.forward(p_ids, (p_mask.cumsum(-1) - 1).clamp(min=0), m4, 1, expand=inv)[:, -1]
        _close(out, ref)
        keys = lean.layers[0].k[:, :, :10]
        torch.testing.assert_close(keys[0], keys[1], rtol=0, atol=0)
        assert not torch.equal(keys[0], keys[2])


def test_one_token_prompts_that_repeat_decode_as_transformers(monkeypatch):
    """Prompts one token long, each twice: the prefill reads the distinct prompts (a one-column block, as a
    decode step's) and must not take the decode steps' grouped-query path, whose mask has a row per batch row.
    Whole greedy rollouts of the lean decoder equal transformers' (the generic path)."""
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.engines.rollout import generate
    from tandem_rlvr.engines.types import Sampling

    model = _qwen3()
    ids = torch.tensor([[5], [5], [7], [7]])

    def rollout():
        return generate(model, None, ids, torch.ones_like(ids), make_schedule("none"),
                        Sampling(max_new_tokens=6, temperature=0.0), eos_token_ids=[2], pad_token_id=0)
    lean = rollout()
    monkeypatch.setattr(fastpath, "LEAN", False)
    assert torch.equal(lean.response_ids_BT, rollout().response_ids_BT)


def test_dropped_rows_leave_the_live_rows_unchanged():
    model = _qwen3()
    B, P, N = 6, 8, 5
    p_ids, p_mask = _left_padded(B, P, model.config.vocab_size, seed=3, lens=[8, 3, 5, 8, 4, 2])
    new = torch.randint(1, model.config.vocab_size, (B, N), generator=torch.Generator().manual_seed(4))
    pad = torch.ones(B, P + N, dtype=torch.bool)
    pad[:, :P] = p_mask.bool()
    pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    plen = p_mask.sum(-1, keepdim=True)
    cols = torch.arange(P)
    m4 = (pad[:, None, None, :P] & (cols[None, :] <= cols[:, None])) | torch.eye(P, dtype=torch.bool)
    live = torch.tensor([True, False, True, False, False, True])
    outs = []
    with torch.inference_mode():
        for drop in (False, True):
            lean = LeanQwen3(model, B, P + N)
            lean.set_padding(pad)
            lean.forward(p_ids, pos, m4, 1)
            steps = []
            for t in range(3):  # single-token steps; rows dropped before the third
                if drop and t == 2:
                    lean.drop_rows(live)
                steps.append(lean.forward(new[:, t:t + 1], plen + t, pad[:, None, None, :P + t + 1], 1))
            allc = torch.arange(P + N)  # then a window of the remaining columns (catch-up), a boolean mask
            q = allc[P + 3:]
            m = pad[:, None, None, :] & (allc[None, :] <= q[:, None])[None, None]
            steps.append(lean.forward(new[:, 3:], plen + torch.arange(3, N), m, N - 3))
            outs.append(torch.cat(steps, 1))
    assert lean.rows.tolist() == [0, 2, 5]
    _close(outs[1][live], outs[0][live])
    assert torch.equal(outs[1][~live, 2:], torch.zeros_like(outs[1][~live, 2:]))


@pytest.fixture(scope="module")
def world_batch(world):
    """The built-in world's tokenizer, senior and weak junior (the conftest's temporary install) and a
    left-padded batch of 4 training prompts, each 3 times."""
    from tandem_rlvr.data import encode_prompts, load_examples
    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.models import load_causal_lm, load_tokenizer

    paths = world[0]
    tok = load_tokenizer(str(paths.senior_dir))
    examples = load_examples("arith/train")[:4]
    _, enc = encode_prompts(tok, examples)
    rows = [e for e in enc for _ in range(3)]  # a GRPO batch: every prompt group_size times
    prompts = PromptBatch.left_padded(rows, tok.pad_token_id)
    senior, junior = load_causal_lm(str(paths.senior_dir)).eval(), load_causal_lm(str(paths.junior_dir)).eval()
    assert supports(senior) and supports(junior)
    return tok, senior, junior, prompts


@pytest.mark.parametrize("mode", ["lockstep", "catchup", "record"])
def test_greedy_tandem_rollouts_equal_with_and_without_the_lean_decoder(world_batch, mode, monkeypatch):
    """``record``: a senior solo rollout in catch-up mode whose junior only records, i.e. reads the whole
    response in windows after rows have finished (and been dropped)."""
    tok, senior, junior, prompts = world_batch
    schedule = make_schedule("none") if mode == "record" else make_schedule("word", tok, p=0.5, max_gap=32)
    kw = {"mode": "catchup", "record_junior": True} if mode == "record" else {"mode": mode}
    out = {}
    for lean in (False, True):
        monkeypatch.setattr(fastpath, "LEAN", lean)
        out[lean] = generate(senior, junior, prompts.ids_BP, prompts.mask_BP, schedule,
                             Sampling(max_new_tokens=112, temperature=0), eos_token_ids=[tok.eos_token_id],
                             pad_token_id=tok.pad_token_id, seed=3, **kw)
    old, new = out[False], out[True]
    lengths = old.response_mask_BT.sum(-1)
    assert lengths.min() < lengths.max(), "the batch must finish rows at different steps (dropped rows)"
    for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "turn_author_BT", "rounds_B", "finished_B"):
        assert torch.equal(getattr(new, name), getattr(old, name)), name
    if mode != "record":
        assert 0 < float(old.owner_BT.sum()) < float(old.response_mask_BT.sum())
    _close(new.senior_logps_BT, old.senior_logps_BT)
    _close(new.junior_logps_BT, old.junior_logps_BT)


def test_lean_decoder_is_used_on_qwen3(world_batch, monkeypatch):
    tok, senior, _, prompts = world_batch
    calls = []
    monkeypatch.setattr(lean_qwen3.LeanQwen3, "forward",
                        lambda self, *a, _f=lean_qwen3.LeanQwen3.forward, **k: calls.append(1) or _f(self, *a, **k))
    generate(senior, None, prompts.ids_BP, prompts.mask_BP, make_schedule("none"), Sampling(max_new_tokens=4),
             eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    assert len(calls) == 4


def _rollout(prompt_ids, prompt_mask, V: int, T: int, seed: int = 0) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    B = prompt_ids.shape[0]
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.randint(1, V, (B, T), generator=g).masked_fill(mask == 0, 0)
    return Rollout(prompt_ids_BP=prompt_ids, prompt_mask_BP=prompt_mask, response_ids_BT=ids, response_mask_BT=mask,
                   owner_BT=mask, senior_logps_BT=torch.zeros(B, T), junior_logps_BT=None,
                   rounds_B=torch.ones(B, dtype=torch.long), finished_B=torch.ones(B, dtype=torch.bool))


@pytest.mark.parametrize("kind", ["qwen3", "qwen2"])
def test_shared_prompt_scoring_equals_one_forward(kind, tokenizer, monkeypatch):
    model = _qwen3() if kind == "qwen3" else make_tiny_model(len(tokenizer), 0, 32)
    V = model.config.vocab_size
    p_ids, p_mask = _left_padded(3, 9, V, seed=5)
    rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    ro = _rollout(p_ids[rows], p_mask[rows], V, 7)
    forwards = []
    model.register_forward_hook(lambda *a: forwards.append(1))
    res = {}
    for shared in (False, True):
        monkeypatch.setattr(fastpath, "SHARED_PROMPTS", shared)
        forwards.clear()
        with torch.no_grad():
            res[shared] = sequence_logps(model, ro, 0.7), len(forwards)
    (lp0, n0), (lp1, n1) = res[False], res[True]
    assert (n0, n1) == (1, 2)  # the shared path ran: the prompts once, then the responses
    m = ro.response_mask_BT.bool()
    _close(lp1[m], lp0[m])


def test_shared_prompts_stay_off_under_autograd_and_never_depend_on_the_data(tokenizer):
    """The update's forward (autograd) stays one forward, as under DDP; without autograd the path does not
    depend on the batch (an FSDP-sharded model's forwards are collective: every process must take the
    same path), so distinct prompts take it too."""
    model = make_tiny_model(len(tokenizer), 0, 32)
    p_ids, p_mask = _left_padded(4, 6, model.config.vocab_size)
    forwards = []
    model.register_forward_hook(lambda *a: forwards.append(1))
    for rows, grad, n in (([0, 0, 1, 1], True, 1), ([0, 1, 2, 3], False, 2)):
        ro = _rollout(p_ids[rows], p_mask[rows], model.config.vocab_size, 5)
        forwards.clear()
        with torch.set_grad_enabled(grad):
            sequence_logps(model, ro, 1.0)
        assert len(forwards) == n, (rows, grad)


def _paired_and_not(senior, junior, ids, mask, monkeypatch, *, schedule, temperature=0.0, seed=3, T=40, eos=()):
    from tandem_rlvr.engines import lean_pair

    out, calls = {}, []
    real = lean_pair.LeanPair.forward
    monkeypatch.setattr(lean_pair.LeanPair, "forward", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    for pair in (False, True):
        monkeypatch.setattr(fastpath, "PAIR", pair)
        out[pair] = generate(senior, junior, ids, mask, schedule, Sampling(max_new_tokens=T, temperature=temperature),
                             eos_token_ids=list(eos), pad_token_id=0, seed=seed, mode="lockstep")
    return out[False], out[True], len(calls)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_paired_lockstep_decode_equals_the_two_models_one_after_the_other(kv_heads, monkeypatch):
    """fastpath.PAIR: the senior and a narrower-MLP junior (zero-padded to the senior's width) decoded as one
    batched model give the same tokens, owners and turns as the two lean decoders run one after the other,
    and the same log-probs up to float order; grouped (2 KV heads) and plain (4) attention; rows that
    finish early are dropped from the pair."""
    senior = _qwen3(num_key_value_heads=kv_heads)
    junior = _qwen3(num_key_value_heads=kv_heads, intermediate_size=56, rope_theta=1e4)
    with torch.no_grad():
        junior.model.norm.weight.mul_(1.5)
    ids, mask = _left_padded(6, 9, 97, seed=1)
    sched = make_schedule("chunk", p=0.5, chunk_size=3)
    for temperature, eos in ((0.0, ()), (1.0, (5, 7, 11))):
        old, new, n = _paired_and_not(senior, junior, ids, mask, monkeypatch, schedule=sched, temperature=temperature,
                                      eos=eos)
        assert n >= 20, "the pair must do the decoding"
        for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "turn_author_BT", "rounds_B", "finished_B"):
            assert torch.equal(getattr(new, name), getattr(old, name)), (temperature, name)
        assert 0 < int(old.owner_BT.sum()) < int(old.response_mask_BT.sum())
        _close(new.senior_logps_BT, old.senior_logps_BT)
        _close(new.junior_logps_BT, old.junior_logps_BT)
    lengths = old.response_mask_BT.sum(-1)
    assert lengths.min() < lengths.max(), "rows must finish at different steps (the pair drops them)"


def test_models_that_do_not_fit_a_pair_decode_one_after_the_other(monkeypatch):
    """A junior of another width (or head count) cannot share the senior's batched matmuls: no pair, the same
    rollout as without the switch."""
    from tandem_rlvr.engines import lean_pair

    senior, junior = _qwen3(), _qwen3(hidden_size=32, head_dim=8)
    ids, mask = _left_padded(4, 7, 97, seed=2)
    old, new, n = _paired_and_not(senior, junior, ids, mask, monkeypatch, schedule=make_schedule("chunk", p=0.5, chunk_size=2))
    assert n == 0
    assert torch.equal(new.response_ids_BT, old.response_ids_BT) and torch.equal(new.owner_BT, old.owner_BT)
    pads = torch.ones(2, 16, dtype=torch.bool)
    a, b, b2 = LeanQwen3(senior, 2, 16), LeanQwen3(junior, 2, 16), LeanQwen3(_qwen3(intermediate_size=56), 2, 16)
    for lean in (a, b, b2):
        lean.set_padding(pads)
    assert not lean_pair.fits(a, b) and lean_pair.fits(a, b2)  # width differs; only the MLP differs


def test_fast_path_switches_turn_off_from_the_environment_and_a_typo_is_an_error(monkeypatch):
    for name in fastpath.SWITCHES:
        monkeypatch.setattr(fastpath, name, True)
    assert fastpath.switches_off_from_env({fastpath.OFF_ENV: " SHARED_PROMPTS_UPDATE, PAIR "}) == [
        "SHARED_PROMPTS_UPDATE", "PAIR"]
    assert not fastpath.SHARED_PROMPTS_UPDATE and not fastpath.PAIR and fastpath.LEAN and fastpath.TRIM
    assert fastpath.switches_off_from_env({}) == [] and fastpath.LEAN
    with pytest.raises(ValueError, match=r"TANDEM_RLVR_FASTPATH_OFF: unknown fast-path switch\(es\) PAIRS; known: .*PAIR"):
        fastpath.switches_off_from_env({fastpath.OFF_ENV: "PAIRS,LEAN"})
    assert fastpath.LEAN  # nothing turned off when one name is wrong


@pytest.mark.parametrize("trained", ["all", "lora_qv"])
def test_prompts_read_once_under_autograd_give_the_per_chunk_gradient(tokenizer, trained):
    """engines.scoring.read_prompts: the distinct prompts read once with autograd on, two chunks reading them as
    leaves and the prompts' backward run once after them, give every trained weight the gradient of a forward
    per chunk over its own prompts (float order). With a LoRA on q and v only, the first layer's keys depend on
    no trained weight: they stay constants (a leaf for them made the prompts' backward fail)."""
    from peft import LoraConfig, get_peft_model

    from tandem_rlvr.engines.scoring import read_prompts

    model = make_tiny_model(len(tokenizer), 0, 32)
    if trained == "lora_qv":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at 0: no gradient would reach A
                torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(1))
    V = model.config.vocab_size
    p_ids, p_mask = _left_padded(2, 6, V, seed=3)
    rows = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    ro = _rollout(p_ids[rows], p_mask[rows], V, 7, seed=4)
    grads = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        prefix = read_prompts(model, ro, torch.arange(8)) if shared else None
        assert (prefix is not None) == shared
        for chunk in (torch.tensor([0, 1, 4, 5]), torch.tensor([2, 3, 6, 7])):
            lp = sequence_logps(model, ro, 0.7, rows=chunk, prefix=prefix)
            (lp * ro.response_mask_BT[chunk]).sum().backward()
        if prefix is not None:
            prefix.backward()
        grads[shared] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    a, b = grads[False], grads[True]
    assert a.keys() == b.keys() and a
    assert all(("lora_" in n) == (trained == "lora_qv") for n in a)
    for n in a:
        scale = a[n].abs().max().item()
        assert scale > 0 and (a[n] - b[n]).abs().max().item() <= 1e-5 * scale, n


def test_prompts_are_not_shared_under_autograd_when_dropout_is_sampled(tokenizer):
    """With dropout active in a training forward (a module's rate or the attention's), each copy of a prompt
    must draw its own mask: read_prompts declines (a forward per chunk), and takes the path again in eval
    mode or at rate 0."""
    from tandem_rlvr.engines.scoring import read_prompts

    def repeated(V):
        p_ids, p_mask = _left_padded(2, 6, V, seed=3)
        return _rollout(p_ids[torch.tensor([0, 0, 1, 1])], p_mask[torch.tensor([0, 0, 1, 1])], V, 5)

    rows = torch.arange(4)
    model = make_tiny_model(len(tokenizer), 0, 32).train()
    ro = repeated(model.config.vocab_size)
    assert read_prompts(model, ro, rows) is not None
    for field in ("attention_dropout", "dropout", "resid_pdrop", "layerdrop"):  # rates applied functionally
        setattr(model.config, field, 0.1)
        assert read_prompts(model, ro, rows) is None and read_prompts(model.eval(), ro, rows) is not None, field
        setattr(model.config, field, 0.0)
        model.train()
    model = _qwen3().train()
    ro = repeated(model.config.vocab_size)
    assert read_prompts(model, ro, rows) is not None
    model.model.layers[0].mlp.act_fn = torch.nn.Sequential(model.model.layers[0].mlp.act_fn, torch.nn.Dropout(0.2))
    assert read_prompts(model, ro, rows) is None


def test_norm_weights_are_folded_in_float32_only_and_bf16_keeps_transformers_order():
    """float32: the layers' RMSNorm weights are folded into qkv and gate/up (one op less per norm, float32
    rounding only, checked by the logits tests above); bf16 keeps them apart (w * x, then x W, as transformers
    computes) because a bf16 fold rounds the product once more (~1.5 bf16 steps of the logits were seen). The
    bf16 logits stay within a few bf16 steps of transformers' (a gross-error bound: the structure is the test)."""
    torch.manual_seed(0)
    model = _qwen3(num_attention_heads=6, num_key_value_heads=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(torch.rand(p.shape, generator=torch.Generator().manual_seed(2)) + 0.5)
    assert all(L.ln1 is None and L.ln2 is None for L in LeanQwen3(model, 2, 8).layers)
    model = model.to(torch.bfloat16)
    lean = LeanQwen3(model, 4, 10)
    first = model.model.layers[0]
    assert torch.equal(lean.layers[0].ln1, first.input_layernorm.weight) and torch.equal(
        lean.layers[0].ln2, first.post_attention_layernorm.weight)
    assert torch.equal(lean.layers[0].qkv[: first.self_attn.q_proj.weight.shape[0]], first.self_attn.q_proj.weight)
    ids, mask = _left_padded(4, 10, model.config.vocab_size)
    pos, real = (mask.cumsum(-1) - 1).clamp(min=0), mask.bool()
    cols = torch.arange(10)
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        lean.set_padding(real)
        out = lean.forward(ids, pos, (real[:, None, None, :] & (cols[None] <= cols[:, None])) | torch.eye(10, dtype=torch.bool), 10)
    scale = float(ref[real].abs().max())
    step = 2.0 ** (math.floor(math.log2(scale)) - 7)  # one bf16 step at the logits' scale
    assert float((out[real] - ref[real]).abs().max()) <= 4 * step


def test_prompts_are_read_once_only_when_they_fit_the_chunk_size(tokenizer):
    """read_prompts holds the prompts' graph until every chunk is done: with more distinct prompts than a chunk
    has rows (``max_prompts``, the trainer's micro-batch) it declines, so algo.micro_batch still bounds the
    prompt activations held at once; a batch without repeats has nothing to share."""
    from tandem_rlvr.engines.scoring import read_prompts

    model = make_tiny_model(len(tokenizer), 0, 32).train()
    V = model.config.vocab_size
    p_ids, p_mask = _left_padded(4, 6, V, seed=3)
    pick = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    ro, rows = _rollout(p_ids[pick], p_mask[pick], V, 5), torch.arange(8)
    assert read_prompts(model, ro, rows, max_prompts=3) is None
    assert read_prompts(model, ro, rows, max_prompts=4) is not None and read_prompts(model, ro, rows) is not None
    assert read_prompts(model, _rollout(p_ids, p_mask, V, 5), torch.arange(4)) is None
