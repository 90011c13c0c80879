"""GPU review: CPU-side demonstrations of defects that would break or corrupt a first CUDA run.

Each test states what the code must do on a GPU and fails on the defect it was written for (a review of the
CUDA paths, 2026-12-06).
No CUDA is needed: a GPU-written checkpoint is imitated by tagging storages "cuda:0" when they are saved, the
launch config's mixed precision by its environment variable, vLLM engines by stand-ins.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from helpers.tiny_models import make_tiny_model
from tandem_rlvr.config import load_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.training import checkpoint as ck


# ---------------------------------------------------------------------------------------------------
# 1. train_state.pt is read with torch.load(...) and no map_location
# ---------------------------------------------------------------------------------------------------

def _parts(tokenizer, seed=0):
    model = make_tiny_model(len(tokenizer), seed, 16, layers=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _one_step(model, opt):
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    opt.zero_grad()


def _save_as_if_on_cuda0(run: Path, tokenizer) -> Path:
    """A checkpoint whose AdamW state is tagged ``cuda:0`` in ``train_state.pt``: what ``optimizer.state_dict()``
    holds on a GPU (rank 0 of a DDP run, or any single-GPU run). The tag is all torch.load looks at to decide
    where to put a tensor when no ``map_location`` is given."""
    model, opt, sched = _parts(tokenizer)
    _one_step(model, opt)
    on_gpu = {t.untyped_storage().data_ptr() for s in opt.state.values() for t in s.values()
              if torch.is_tensor(t) and t.dim() > 0}

    def tagger(storage):
        return "cuda:0" if storage.data_ptr() in on_gpu else None

    entry = (0, tagger, lambda obj, location: None)  # priority 0: before torch's own cpu tagger
    torch.serialization._package_registry.append(entry)
    torch.serialization._package_registry.sort(key=lambda e: e[0])
    try:
        return ck.save_checkpoint(run, 1, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                                  trainer_state={}, keep_last=5)
    finally:
        torch.serialization._package_registry.remove(entry)


@pytest.mark.skipif(torch.cuda.is_available(), reason="imitates a GPU checkpoint on a machine without CUDA")
def test_a_gpu_written_train_state_is_loaded_with_an_explicit_map_location(tmp_path, tokenizer):
    """``load_checkpoint`` reads ``train_state.pt`` with ``torch.load(..., weights_only=True)`` and no
    ``map_location``: every tensor goes back to the device it was saved from. On a multi-GPU DDP resume that is
    ``cuda:0`` for *every* rank (rank 0 wrote the file), so each rank >= 1 allocates the whole AdamW state
    (2x the senior in fp32) on GPU 0 before ``optimizer.load_state_dict`` moves it to its own GPU; on a machine
    without CUDA the resume fails outright. Here: the CPU-only case."""
    ckpt = _save_as_if_on_cuda0(tmp_path / "run", tokenizer)
    model, opt, sched = _parts(tokenizer, seed=7)
    state = ck.load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched)  # was: 'Attempting to deserialize object on a CUDA device'
    assert state["step"] == 1
    assert all(t.device.type == "cpu" for s in opt.state.values() for t in s.values() if torch.is_tensor(t))


def test_load_checkpoint_passes_map_location_to_every_torch_load(tmp_path, tokenizer, monkeypatch):
    """The same defect seen from the call: every ``torch.load`` of ``load_checkpoint`` should say where tensors go
    (``map_location="cpu"``; ``mmap=True`` also keeps the non-main FSDP ranks, which never use the full optimizer
    state they used to read, from each holding a host copy of it)."""
    model, opt, sched = _parts(tokenizer)
    ckpt = ck.save_checkpoint(tmp_path / "run", 1, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
                              trainer_state={}, keep_last=5)
    calls = []
    real = torch.load

    def spy(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    model2, opt2, sched2 = _parts(tokenizer, seed=7)
    ck.load_checkpoint(ckpt, model=model2, optimizer=opt2, scheduler=sched2)
    assert calls, "load_checkpoint read train_state.pt"
    assert all(kw.get("map_location") is not None for kw in calls), calls


# ---------------------------------------------------------------------------------------------------
# 2. fp16 from the accelerate launch config over fp16 weights is not refused
# ---------------------------------------------------------------------------------------------------

def test_grad_scaler_refuses_fp16_gradients():
    """What a run with fp16 weights under accelerate's fp16 (GradScaler) meets at its first clip_grad_norm_."""
    m = torch.nn.Linear(4, 4).half()
    opt = torch.optim.AdamW(m.parameters())
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(m(torch.randn(2, 4).half()).float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)


def test_launch_config_fp16_over_fp16_weights_is_refused_before_the_run(monkeypatch):
    """``config_bounds.model_checks`` refuses ``model.mixed_precision=fp16`` with ``model.dtype=float16`` (half
    compute needs float32 weights), but only when the key is set in the run config; with the key empty (every
    shipped config) the accelerate launch config's ``mixed_precision: fp16`` reaches the Accelerator unchecked
    (``build.check_mixed_precision`` looks at fp16 vs CPU and FSDP only). accelerate then makes a GradScaler,
    and the first ``acc.clip_grad_norm_`` raises torch's 'Attempting to unscale FP16 gradients.'"""
    from tandem_rlvr.training.build import check_mixed_precision

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what accelerate launch exports from its config
    cfg = load_config(None, ["model.senior=x", "model.self_paired=true", "model.dtype=float16", "model.lora_r=8"])
    with pytest.raises(TandemError, match="fp16"):
        check_mixed_precision(cfg, cuda=True)


# ---------------------------------------------------------------------------------------------------
# 3. algo.old_logps=auto reuses bf16-autocast decode log-probs
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["config", "launch"])
def test_old_logps_auto_recomputes_when_the_senior_computes_in_bf16(monkeypatch, where):
    """``auto`` takes the rollout's recorded log-probs when ``model.dtype == "float32"``, but the shipped
    launch configs (and ``model.mixed_precision=bf16``) run every senior forward under accelerate's bf16 autocast:
    the rollout's are then KV-cached bf16 decode log-probs, the update's teacher-forced bf16 ones, and the PPO
    ratio of the first epoch is not 1 (clipping on bf16 noise). The docs' own rule: recompute "where decode and
    training differ in precision"."""
    from tandem_rlvr.training import trainer as tr

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    over = ["model.senior=x", "model.self_paired=true", "model.dtype=float32", "algo.old_logps=auto"]
    if where == "config":
        over.append("model.mixed_precision=bf16")
    cfg = load_config(None, over)
    recorded = torch.full((2, 3), -1.0)
    rollout = types.SimpleNamespace(logps_recorded=True, senior_logps_BT=recorded)
    recomputed = torch.full((2, 3), -2.0)
    monkeypatch.setattr(tr, "sequence_logps", lambda *a, **k: recomputed)
    fake = types.SimpleNamespace(cfg=cfg, bridge=False, acc=types.SimpleNamespace(mixed_precision="bf16"),
                                 rows_per_forward=1)
    got = tr.Trainer._old_logps(fake, object(), rollout)
    assert got is recomputed, "auto reused the bf16 decode log-probs as the PPO ratio's old log-probs"


# ---------------------------------------------------------------------------------------------------
# 4. eval: one vLLM engine per senior, never closed
# ---------------------------------------------------------------------------------------------------

def test_eval_closes_each_seniors_engine(monkeypatch, tmp_path):
    """``eval_cli._eval_senior`` builds one rollout engine per senior (``--engine vllm``: a vLLM engine that takes
    ``--vllm-memory`` of the GPU) and drops it with ``del senior, engine`` without ``engine.close()``: the
    in-process vLLM engine core is not shut down, so with several seniors each new engine starts beside the
    previous ones' memory (vLLM refuses to start once free memory is below its share)."""
    from tandem_rlvr import models
    from tandem_rlvr.evaluation import crosstok, eval_cli
    from tandem_rlvr.evaluation.options import EvalOptions

    engines = []

    class StandIn:
        closed = False

        def close(self):
            self.closed = True

    def make_engine(*a, **k):
        engines.append(StandIn())
        return engines[-1]

    monkeypatch.setattr(models, "load_tokenizer", lambda *a, **k: object())
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: torch.nn.Linear(1, 1))
    monkeypatch.setattr(crosstok, "same_vocabulary", lambda *a: True)
    monkeypatch.setattr(crosstok, "template_kind", lambda tok: "plain")
    monkeypatch.setattr(crosstok, "evaluate_any_pair", lambda *a, **k: ({"solo_pass@1": 0.0}, []))
    monkeypatch.setattr(eval_cli, "_engine", make_engine)
    monkeypatch.setattr(eval_cli, "_fingerprint", lambda *a, **k: "fp")
    monkeypatch.setattr("tandem_rlvr.evaluation.metrics.macro_average", lambda per: {})
    opts = EvalOptions(out=str(tmp_path / "eval"), device="cpu", dtype="float32", engine="vllm")
    benches = {"b": ("src", [])}
    for name in ("s1", "s2"):
        eval_cli._eval_senior(opts, name, f"/models/{name}", object(), object(), benches, scorer=None,
                              junior_path="/models/j")
    assert len(engines) == 2
    assert all(e.closed for e in engines), "a senior's engine was left running when the next one was built"


# ---------------------------------------------------------------------------------------------------
# 5. sampling copies every row's probabilities to the host
# ---------------------------------------------------------------------------------------------------

def test_sampling_never_copies_the_rows_probabilities_to_the_host(monkeypatch):
    """``sample_tokens`` used to move the ``B x V`` probabilities to the CPU every token (``.cpu()``, ~30 ms a token
    at B=16 with a 152k vocabulary on a GPU) to draw there. Now only the ``B`` uniforms come from the CPU
    generator; the draw runs where the logits are. Same tokens as drawing on the host from the same stream."""
    from tandem_rlvr.engines.types import Sampling, draw, sample_tokens

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    expected = draw((logits / 0.7).softmax(-1), torch.Generator().manual_seed(3))

    def no_host_copy(self, *a, **k):
        raise AssertionError("a tensor was copied to the host while sampling")

    monkeypatch.setattr(torch.Tensor, "cpu", no_host_copy)
    got = sample_tokens(logits, Sampling(max_new_tokens=4, temperature=0.7), torch.Generator().manual_seed(3))
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------------------------------
# 6. saving a LoRA senior deep-copied it on its device
# ---------------------------------------------------------------------------------------------------

def test_the_merged_lora_senior_is_copied_tensor_by_tensor_to_the_cpu(tokenizer, monkeypatch):
    """``_save_weights`` merged a LoRA senior on ``copy.deepcopy(model)``: a second whole model on its GPU at every
    checkpoint, ``best/`` and ``final/``. ``_cpu_copy`` hands deepcopy a CPU copy of every parameter and buffer, so
    deepcopy itself copies no tensor (on a GPU it would copy it on the GPU); tied weights stay one tensor, and the
    copy's values are the model's."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(make_tiny_model(len(tokenizer), 0, 16, layers=1),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    deep_copied = []
    real = torch.Tensor.__deepcopy__

    def spy(self, memo):
        deep_copied.append(tuple(self.shape))
        return real(self, memo)

    monkeypatch.setattr(torch.Tensor, "__deepcopy__", spy)
    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", spy)
    copy_ = ck._cpu_copy(model)
    assert not deep_copied, f"deepcopy copied tensors itself: {deep_copied[:5]}"
    mine, theirs = dict(model.named_parameters()), dict(copy_.named_parameters())
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[n], theirs[n]) and mine[n] is not theirs[n] for n in mine)
    base = copy_.get_base_model()
    assert base.lm_head.weight is base.model.embed_tokens.weight  # tied weights stay tied


def test_saving_a_lora_senior_merges_the_cpu_copy_not_the_model(tokenizer, tmp_path, monkeypatch):
    """``save_checkpoint`` (and so ``best/`` and ``final/``) of a LoRA senior goes through ``_cpu_copy``; the model
    itself is neither copied on its device nor changed, and the saved weights are the merged ones."""
    from peft import LoraConfig, get_peft_model

    from tandem_rlvr.models import load_causal_lm

    model = get_peft_model(make_tiny_model(len(tokenizer), 0, 16, layers=1),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    copies = []
    real = ck._cpu_copy
    monkeypatch.setattr(ck, "_cpu_copy", lambda m: copies.append(m) or real(m))
    ckpt = ck.save_checkpoint(tmp_path / "run", 1, model=model, tokenizer=tokenizer, optimizer=opt,
                              scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), trainer_state={})
    assert copies == [model]
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    from helpers.numeric import assert_close_to_scale

    with torch.no_grad():  # merged W + BA against the adapter's own forward: float order, as tests/training/test_lora.py
        assert_close_to_scale(load_causal_lm(str(ckpt))(input_ids=ids).logits, model(input_ids=ids).logits, ulps=2048)


# ---------------------------------------------------------------------------------------------------
# 5. the junior computes under the senior's mixed precision
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arm", ["kl_reg", "trlvr"])
def test_a_self_paired_junior_starts_at_zero_drift_under_bf16_mixed_precision(tokenizer, tmp_path, monkeypatch, arm):
    """accelerate autocasts only the model it prepares: under bf16 mixed precision the senior computed its matrix
    products in bf16 and the float32 self-paired junior in float32, so before any update kl/senior_junior (claim
    3's drift) and KL-Reg's term read a precision offset (1.4e-3 nats in a review's run), not 0. The junior now
    runs under the same autocast, on transformers' path (the GPU's). trlvr: the junior's log-probs are those
    recorded in the tandem decode, so the senior's recorded ones are compared with them, not its teacher-forced
    recomputation (``old`` under mixed precision), another bf16 computation: 5e-4 nats apart in a review's run on
    a 128-wide Qwen3; here every teacher-forced pass is offset by 1e-3 to stand for that difference."""
    import copy

    from accelerate.state import AcceleratorState, GradientState

    from helpers.tiny_models import make_tiny_model
    from tandem_rlvr.engines import fastpath
    from tandem_rlvr.models import Pair, freeze
    from tandem_rlvr.training.trainer import make_trainer

    from tandem_rlvr.training import trainer as trainer_module

    monkeypatch.setattr(fastpath, "FAST_PATH_DEVICES", ())  # transformers' forwards, as on a GPU
    teacher_forced = trainer_module.sequence_logps
    monkeypatch.setattr(trainer_module, "sequence_logps", lambda *a, **k: teacher_forced(*a, **k) + 1e-3)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    senior = make_tiny_model(len(tokenizer), 0, 64)
    with torch.no_grad():
        senior.lm_head.weight.mul_(8.0)  # logits of a language model's spread: bf16 rounding shows in the KL
    examples = [types.SimpleNamespace(id=str(i), problem=f"What is {i} plus 2?", answer=str(i + 2)) for i in range(4)]
    beta = ["algo.kl_beta=1e-3"] if arm == "kl_reg" else []
    cfg = load_config(None, [f"algo.arm={arm}", *beta, "model.senior=unused", "model.self_paired=true",
                             "model.mixed_precision=bf16", "algo.old_logps=recompute", "train.steps=1",
                             "train.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=16",
                             f"train.out_dir={tmp_path}", "algo.lr=1e-6", "train.save_every=0", "train.progress=false"])
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        tr = make_trainer(cfg, pair=Pair(senior, freeze(copy.deepcopy(senior)), tokenizer),
                          reward_fn=lambda c, g: float(len(c) % 2 == 0), examples=examples)
        assert tr.acc.mixed_precision == "bf16"
        row = tr.train_step(0)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert row["kl/senior_junior"] == pytest.approx(0.0, abs=1e-7)
    assert row["kl/senior_junior_k3"] == pytest.approx(0.0, abs=1e-7)


# ---------------------------------------------------------------------------------------------------
# 6. a bf16 copy of the senior keeps the float32 buffers a bf16 load keeps
# ---------------------------------------------------------------------------------------------------

def test_the_bf16_self_paired_junior_keeps_ropes_float32_inv_freq_as_a_bf16_load_does(tmp_path):
    """model.junior_dtype=bfloat16 with self_paired: the junior was ``deepcopy(senior).to(bf16)``, which also cast
    RoPE's inv_freq (relative error 3.7e-3 in a review): its angles then drift with the position, unlike the same
    weights loaded in bf16 (the vLLM engine's junior). Only the parameters are cast now."""
    import copy

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tandem_rlvr.models import cast_parameters

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, rope_theta=1e6)
    senior = Qwen3ForCausalLM(cfg)
    senior.save_pretrained(tmp_path)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    junior = cast_parameters(copy.deepcopy(senior), torch.bfloat16)
    assert {p.dtype for p in junior.parameters()} == {torch.bfloat16}
    assert junior.lm_head.weight is junior.model.embed_tokens.weight  # still tied
    want = {n: b.dtype for n, b in loaded.named_buffers()}
    assert want and {n: b.dtype for n, b in junior.named_buffers()} == want
    assert junior.model.rotary_emb.inv_freq.dtype == torch.float32
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        assert torch.equal(junior(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert {p.dtype for p in senior.parameters()} == {torch.float32}  # the senior itself untouched


# ---------------------------------------------------------------------------------------------------
# 7. AdamW on CUDA is fused: no float32 copy of the second moments at every step
# ---------------------------------------------------------------------------------------------------

def test_adamw_is_fused_on_cuda_parameters_and_the_default_elsewhere(monkeypatch):
    """torch's default AdamW on CUDA (foreach) allocates sqrt(v) for every parameter at once at each step, 16 GB for
    an unsharded 4B model at the update's peak; the fused kernel allocates none (and takes FSDP2's DTensors: checked
    on CPU with two gloo processes, fused equal to foreach within 1.5e-8 after 3 steps). CPU runs keep the default."""
    from tandem_rlvr.training import build

    made = []
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, **kw: made.append(kw))
    cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    build.make_adamw([cuda, cuda], lr=1e-6, weight_decay=0.0)
    build.make_adamw([torch.nn.Parameter(torch.zeros(2))], lr=1e-6, weight_decay=0.0)
    build.make_adamw([cuda, torch.nn.Parameter(torch.zeros(2))], lr=1e-6, weight_decay=0.0)
    assert [kw.get("fused") for kw in made] == [True, None, None]
    assert all(kw["lr"] == 1e-6 for kw in made)


# ---------------------------------------------------------------------------------------------------
# 8. under mixed precision the in-process rollout casts each weight once, not at every token
# ---------------------------------------------------------------------------------------------------

def test_the_in_process_rollout_casts_the_weights_once_under_mixed_precision(tokenizer):
    """float32 weights under bf16 autocast (one GPU, no FSDP): under inference_mode autocast keeps no cast, so every
    decode step cast every weight again (a review's profile: all 29 of 29 linear weights per token; on Qwen3-4B
    ~3x a step's weight traffic). The rollout now runs under no_grad in one (disabled) autocast region: the casts
    are made once and held; the tokens are the same."""
    from torch.profiler import ProfilerActivity, profile

    from tandem_rlvr.engines.handoff import make_schedule
    from tandem_rlvr.engines.inprocess import InProcessEngine
    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.engines.types import Sampling

    senior = make_tiny_model(len(tokenizer), 0, 64).eval()
    forward = senior.forward

    def autocast_forward(*a, **k):  # what accelerate's prepare installs under mixed_precision=bf16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward(*a, **k)

    senior.forward = autocast_forward
    batch = PromptBatch.left_padded([tokenizer.encode(t) for t in ("What is 3 plus 4?", "hi")], tokenizer.pad_token_id)
    n_new, casts, rows = 12, {}, {}
    weight_shapes = {tuple(m.weight.shape) for m in senior.modules() if isinstance(m, torch.nn.Linear)}
    for hold in (False, True):
        engine = InProcessEngine(senior, None, eos_token_ids=[tokenizer.eos_token_id],
                                 pad_token_id=tokenizer.pad_token_id, hold_casts=hold)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            ro = engine.generate(batch, make_schedule("none"), Sampling(n_new, 0), seed=0)
        casts[hold] = sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes
                          and tuple(e.input_shapes[0]) in weight_shapes)
        rows[hold] = ro.response_ids_BT
    n_weights = sum(1 for m in senior.modules() if isinstance(m, torch.nn.Linear))
    assert casts[False] >= n_weights * n_new  # every step casts every weight again
    assert casts[True] <= n_weights  # the prefill's casts, held for the rollout
    assert torch.equal(rows[False], rows[True])
