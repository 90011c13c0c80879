"""The GPU knobs of ``model``: ``attn_implementation`` and the revisions reach transformers' ``from_pretrained``
for senior, junior and tokenizers (spies on transformers' loaders, tiny local models behind hub names), eager
and sdpa really load and agree, ``mixed_precision`` reaches accelerate's ``Accelerator``, and the combinations
that would not do what they say are refused with one line naming the key."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers.time_guard import no_hang  # noqa: F401 (autouse: a case over a minute fails instead of hanging)
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.errors import TandemError
from tandem_rlvr.models import load_pair


@pytest.fixture
def hub(monkeypatch, model_dirs):
    """transformers' loaders, spied: ``org/senior`` and ``org/junior`` are the tiny local models; each call's
    hub name and keyword arguments are recorded (a revision given for a local directory is recorded too)."""
    import transformers

    local = {"org/senior": str(model_dirs[0]), "org/junior": str(model_dirs[1])}
    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        real = cls.from_pretrained.__func__

        def spy(klass, name, *args, _real=real, _cls=cls, **kwargs):
            calls.append((_cls.__name__, str(name), dict(kwargs)))
            kwargs.pop("revision", None)
            return _real(klass, local.get(str(name), name), *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return calls


def _of(calls, name):
    return [(cls, kw) for cls, n, kw in calls if n == name]


def test_revisions_and_attention_reach_every_from_pretrained_of_senior_and_junior(hub):
    cfg = load_config(None, ["model.senior=org/senior", "model.junior=org/junior", "model.revision=abc123",
                             "model.junior_revision=v2", "model.attn_implementation=eager"])
    pair = load_pair(cfg.model)
    for name, rev in (("org/senior", "abc123"), ("org/junior", "v2")):
        got = _of(hub, name)
        assert {cls for cls, _ in got} == {"AutoConfig", "AutoTokenizer", "AutoModelForCausalLM"}, got
        assert all(kw.get("revision") == rev for _, kw in got), (name, got)
        assert [kw.get("attn_implementation") for cls, kw in got if cls == "AutoModelForCausalLM"] == ["eager"]
    assert pair.senior.config._attn_implementation == pair.junior.config._attn_implementation == "eager"


def test_empty_knobs_pass_nothing_so_transformers_defaults_apply(hub):
    load_pair(load_config(None, ["model.senior=org/senior", "model.junior=org/junior"]).model)
    ours = [kw for _, name, kw in hub if name.startswith("org/")]  # (transformers' inner calls name the directory)
    assert len(ours) == 6 and all("revision" not in kw and "attn_implementation" not in kw for kw in ours), ours


def test_the_preflight_reads_the_same_revisions(hub, tmp_path):
    from tandem_rlvr import preflight

    cfg = load_config(None, ["model.senior=org/senior", "model.junior=org/junior", "model.revision=abc123",
                             "model.junior_revision=v2", f"train.out_dir={tmp_path / 'run'}"])
    preflight.check_train(cfg, data=False, reward=False)
    for name, rev in (("org/senior", "abc123"), ("org/junior", "v2")):
        got = _of(hub, name)
        assert got and all(kw.get("revision") == rev for _, kw in got), (name, got)


def test_a_revision_for_a_local_directory_is_ignored_with_a_warning(hub, model_dirs, caplog):
    cfg = load_config(None, [f"model.senior={model_dirs[0]}", "model.self_paired=true", "model.revision=abc123"])
    with caplog.at_level(logging.WARNING, logger="tandem_rlvr.models"):
        load_pair(cfg.model)
    assert hub and all(kw.get("revision") is None for _, _, kw in hub), hub  # inner calls too: none asked for it
    assert f"senior: revision 'abc123' ignored: '{model_dirs[0]}' is a local directory" in caplog.text


def test_eager_and_sdpa_really_load_and_agree(model_dirs):
    ids = torch.tensor([[5, 9, 13, 21, 34, 55]])
    logits = {}
    for impl in ("eager", "sdpa"):
        cfg = load_config(None, [f"model.senior={model_dirs[0]}", f"model.junior={model_dirs[1]}",
                                 f"model.attn_implementation={impl}"])
        pair = load_pair(cfg.model)
        assert pair.senior.config._attn_implementation == pair.junior.config._attn_implementation == impl
        with torch.no_grad():
            logits[impl] = pair.senior.eval()(ids).logits
    scale = logits["eager"].abs().max().item()
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-4, atol=1e-5 * max(scale, 1.0))


# -- mixed precision -------------------------------------------------------------------------------------------
class _SpyAccelerator:
    made: list = []

    def __init__(self, **kwargs):
        self.made.append(kwargs)
        self.distributed_type, self.num_processes = "NO", 1


@pytest.mark.parametrize(("value", "passed"), [("bf16", "bf16"), ("off", "no"), ("no", "no"), ("", None)])
def test_mixed_precision_reaches_the_accelerator(monkeypatch, tmp_path, value, passed):
    import accelerate

    from tandem_rlvr.training import build

    monkeypatch.setattr(accelerate, "Accelerator", _SpyAccelerator)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    _SpyAccelerator.made = []
    cfg = load_config(None, ["model.senior=x", "model.self_paired=true", f"model.mixed_precision={value}",
                             f"train.out_dir={tmp_path / 'run'}"])
    build._accelerator(cfg)
    assert [kw["mixed_precision"] for kw in _SpyAccelerator.made] == [passed]  # None: the launch config's


def test_fp16_where_it_would_not_apply_is_one_line(monkeypatch):
    from tandem_rlvr.training.build import check_mixed_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    fp16 = load_config(None, ["model.senior=x", "model.self_paired=true", "model.mixed_precision=fp16"])
    with pytest.raises(TandemError, match=r"^model\.mixed_precision is fp16, which needs a CUDA GPU \(none here"):
        check_mixed_precision(fp16, cuda=False)
    check_mixed_precision(fp16, cuda=True)
    bf16 = load_config(None, ["model.senior=x", "model.self_paired=true", "model.mixed_precision=bf16"])
    check_mixed_precision(bf16, cuda=False)  # bf16 autocast runs on a CPU
    launched = load_config(None, ["model.senior=x", "model.self_paired=true", "train.fsdp=full"])
    check_mixed_precision(launched, cuda=True)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what accelerate launch sets from its config
    with pytest.raises(TandemError, match=r"^the accelerate launch config's mixed_precision is fp16, which "
                                          r"train\.fsdp=full does not support"):
        check_mixed_precision(launched, cuda=True)


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.mixed_precision=bf16", "model.dtype=bfloat16"],
     "config key 'model.mixed_precision' is bf16: half-precision compute over float32 weights; with "
     "model.dtype=bfloat16 set model.dtype=float32 (float32 weights and optimizer, half-precision compute)"),
    (["model.dtype=bfloat16"], "config key 'model.dtype' is bfloat16, the weights AdamW updates in a full fine-tune "
     "(model.lora_r=0): in bfloat16 an update of algo.lr=1e-06 rounds away or overflows; use model.dtype=float32 with "
     "model.mixed_precision=bf16"),
    (["model.dtype=float16", "model.lora_r=0"], "config key 'model.dtype' is float16, the weights AdamW updates"),
    (["model.mixed_precision=fp16", "model.dtype=float16"], "config key 'model.mixed_precision' is fp16: half-precision"),
    (["model.mixed_precision=fp16", "train.fsdp=zero2"],
     "config key 'model.mixed_precision' is fp16, which train.fsdp=zero2 does not support"),
    (["model.junior_revision=v2"], "config key 'model.junior_revision' must be empty when model.self_paired is true"),
    (["model.attn_implementation=flash"], "config key 'model.attn_implementation' must be one of '', eager, sdpa,"),
])
def test_combinations_that_would_not_do_what_they_say_are_refused(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.senior=x", "model.self_paired=true", *overrides])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_knobs_pass_where_they_make_sense():
    for ok in (["model.mixed_precision=bf16"], ["model.mixed_precision=fp16"], ["model.revision=abc"],
               ["model.revision=abc", "rollout.engine=vllm"],  # the engines read the snapshot at that revision
               ["model.dtype=bfloat16", "model.lora_r=8"], ["model.dtype=float16", "model.lora_r=8"],  # float32 adapters
               ["model.mixed_precision=bf16", "train.fsdp=full"], ["model.attn_implementation=flash_attention_2"]):
        load_config(None, ["model.senior=x", "model.self_paired=true", *ok])


def test_float32_compute_on_a_gpu_is_named(monkeypatch, caplog):
    """The paper configs' one-GPU recipe started without `accelerate launch` had no mixed precision from anywhere:
    every forward and backward in float32 on the GPU, silently. Such a run now says so once, naming the key (the
    configs' comment names it too); with bf16 from the key or the launch config, or on a CPU, nothing is said."""
    from tandem_rlvr.training.build import check_mixed_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    from tandem_rlvr.configs import path_of

    plain = load_config("paper/trlvr", ["train.fsdp=off"])
    assert "train.fsdp=off model.mixed_precision=bf16" in path_of("paper/trlvr").read_text()  # its one-GPU recipe
    with caplog.at_level("WARNING"):
        check_mixed_precision(plain, cuda=False)  # a CPU: float32 is the point
        check_mixed_precision(load_config("paper/trlvr", ["train.fsdp=off", "model.mixed_precision=bf16"]), cuda=True)
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # an accelerate launch with the shipped configs
        check_mixed_precision(plain, cuda=True)
        assert not caplog.records
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
        check_mixed_precision(plain, cuda=True)
    assert len(caplog.records) == 1 and "model.mixed_precision=bf16" in caplog.records[0].getMessage()
