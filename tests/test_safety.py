"""Safety of what we load and write: no remote code unless asked, safetensors only, no pickles loaded
with code execution, no eval/exec of text anywhere in the package."""

from __future__ import annotations

import argparse

import ast
import copy
import re
from pathlib import Path

import pytest
from helpers.tiny_models import make_tiny_model

import tandem_rlvr
from tandem_rlvr.config import load_config
from tandem_rlvr.data import Example
from tandem_rlvr.models import Pair, freeze, load_pair

PKG = Path(tandem_rlvr.__file__).resolve().parent
SOURCES = sorted(PKG.rglob("*.py"))


def _trees():
    for path in SOURCES:
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _calls(tree):
    return (n for n in ast.walk(tree) if isinstance(n, ast.Call))


def _dotted(func) -> str:
    """``a.b.c`` for a call's function expression ("" if it is not a plain dotted name)."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
        return ".".join(reversed(parts))
    return ""


def _kw(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _where(path, node) -> str:
    return f"{path.relative_to(PKG.parent)}:{node.lineno}"


def test_sources_were_found():
    assert len(SOURCES) > 15 and PKG / "training" / "trainer.py" in SOURCES


# ------------------------------------------------------------------------------------------------
# trust_remote_code


def test_trust_remote_code_is_never_hard_coded_true():
    text_hits = [f"{p.name}: {ln.strip()}" for p in SOURCES for ln in p.read_text(encoding="utf-8").splitlines()
                 if re.search(r"trust_remote_code\s*=\s*True", ln)]
    assert not text_hits, text_hits
    bad = []
    for path, tree in _trees():
        for call in _calls(tree):
            v = _kw(call, "trust_remote_code")
            if isinstance(v, ast.Constant) and v.value is not False:
                bad.append(_where(path, call))
            elif v is not None and not isinstance(v, (ast.Name, ast.Attribute, ast.Constant)):
                bad.append(_where(path, call) + " (computed value)")
    assert not bad, bad
    # the defaults everywhere a user can set it are False
    from tandem_rlvr.config import ModelConfig
    from tandem_rlvr.evaluation.eval_cli import EvalOptions, resolve_options

    assert ModelConfig().trust_remote_code is False and EvalOptions().trust_remote_code is False
    flags = argparse.Namespace(seniors=["s"], juniors=["j"], benchmarks=["b"])
    assert resolve_options(flags).trust_remote_code is False


@pytest.mark.parametrize("asked", [False, True])
def test_load_pair_passes_the_configs_trust_remote_code(model_dirs, monkeypatch, asked):
    import transformers

    seen: list[tuple[str, object]] = []
    for cls_name in ("AutoModelForCausalLM", "AutoTokenizer", "AutoConfig"):
        cls = getattr(transformers, cls_name)
        original = cls.from_pretrained.__func__

        def recording(klass, *args, _orig=original, _name=cls_name, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "<not passed>")))
            return _orig(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(recording))
    senior, junior = model_dirs
    cfg = load_config(None, [f"model.senior={senior}", f"model.junior={junior}", f"model.trust_remote_code={asked}"])
    load_pair(cfg.model)
    names = {n for n, _ in seen}
    assert {"AutoModelForCausalLM", "AutoTokenizer"} <= names, seen
    # our own calls (AutoConfig may also be called by transformers internally, always with our value)
    ours = [(n, v) for n, v in seen if v != "<not passed>"]
    assert len([n for n, _ in ours if n == "AutoModelForCausalLM"]) == 2  # senior and junior
    assert all(v is asked for _, v in ours), seen


# ------------------------------------------------------------------------------------------------
# what we write is safetensors; what we torch.load is weights only

EXAMPLES = [Example(str(i), f"What is {i} plus 1?", str(i + 1)) for i in range(4)]


def _run(tmp_path, tokenizer, lora: bool):
    from tandem_rlvr.models import AdapterOff, _apply_lora
    from tandem_rlvr.training.trainer import make_trainer

    extra = ["model.self_paired=true", "model.junior=null", "model.lora_r=4"] if lora else []
    cfg = load_config(None, ["model.senior=unused", "model.junior=unused", "algo.arm=grpo", "train.steps=1",
                             "train.prompts_per_step=2", "algo.group_size=2", "algo.mini_batch_prompts=2",
                             "rollout.max_new_tokens=4", f"train.out_dir={tmp_path / 'run'}", "train.save_every=1",
                             "train.progress=false", *extra])
    senior = make_tiny_model(len(tokenizer), 0)
    if lora:
        senior = _apply_lora(senior, cfg.model)
        pair = Pair(senior, AdapterOff(senior), tokenizer, lora=True)
    else:
        pair = Pair(senior, freeze(copy.deepcopy(senior)), tokenizer)
    return make_trainer(cfg, pair=pair, examples=EXAMPLES, reward_fn=lambda c, g: float(len(c) % 2)).train().parent


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoints_and_final_are_safetensors(tmp_path, tokenizer, lora):
    run = _run(tmp_path, tokenizer, lora)
    ckpt, final = run / "checkpoints" / "step-1", run / "final"
    for d in (ckpt, final):
        assert list(d.glob("*.safetensors")), sorted(p.name for p in d.iterdir())
        assert not (d / "pytorch_model.bin").exists()
    files = [p for p in run.rglob("*") if p.is_file()]
    pickles = [p.name for p in files if p.suffix in (".bin", ".pkl", ".pickle", ".pth", ".ckpt", ".joblib")]
    assert not pickles, pickles
    pts = sorted(str(p.relative_to(run)) for p in files if p.suffix == ".pt")
    allowed = {"checkpoints/step-1/train_state.pt"} | ({"checkpoints/step-1/lora_state.pt"} if lora else set())
    assert set(pts) == allowed, pts  # tensors-only state dicts, read back with weights_only=True (below)
    if lora:
        assert list((ckpt / "adapter").glob("*.safetensors"))


def test_every_torch_load_is_weights_only_and_no_unsafe_deserialisers():
    loads, bad = [], []
    unsafe = {"pickle.load", "pickle.loads", "cPickle.load", "dill.load", "dill.loads", "joblib.load",
              "marshal.load", "marshal.loads", "yaml.load", "yaml.unsafe_load", "yaml.full_load", "shelve.open"}
    for path, tree in _trees():
        for call in _calls(tree):
            name = _dotted(call.func)
            if name == "torch.load":
                loads.append(_where(path, call))
                v = _kw(call, "weights_only")
                if not (isinstance(v, ast.Constant) and v.value is True):
                    bad.append(_where(path, call) + " torch.load without weights_only=True")
            elif name in unsafe:
                bad.append(f"{_where(path, call)} {name}")
            elif name.endswith("np.load") or name == "numpy.load":
                v = _kw(call, "allow_pickle")
                if v is not None and not (isinstance(v, ast.Constant) and v.value is False):
                    bad.append(f"{_where(path, call)} np.load(allow_pickle=...)")
    assert not bad, bad
    assert len(loads) >= 2, loads  # train_state.pt and lora_state.pt in checkpoint.py
    ckpt_src = (PKG / "training" / "checkpoint.py").read_text()
    assert 'torch.load(ckpt / "train_state.pt", weights_only=True, map_location="cpu", mmap=True)' in ckpt_src


# ------------------------------------------------------------------------------------------------
# no eval / exec of text


def test_no_eval_exec_or_compile_of_text_in_the_package():
    """Builtin ``eval``/``exec``/``compile``/``__import__`` calls are refused (``model.eval()``,
    ``re.compile`` and other attribute calls are methods, not the builtins); nor ``shell=True``."""
    bad = []
    for path, tree in _trees():
        for call in _calls(tree):
            f = call.func
            if isinstance(f, ast.Name) and f.id in ("eval", "exec", "compile", "__import__", "breakpoint"):
                bad.append(f"{_where(path, call)} {f.id}(...)")
            elif _dotted(f) in ("builtins.eval", "builtins.exec", "builtins.compile", "os.system", "os.popen"):
                bad.append(f"{_where(path, call)} {_dotted(f)}(...)")
            shell = _kw(call, "shell")
            if shell is not None and not (isinstance(shell, ast.Constant) and shell.value is False):
                bad.append(f"{_where(path, call)} shell=...")
    assert not bad, bad


def test_the_ast_scan_would_catch_them():
    tree = ast.parse("x = eval(s)\nexec(code)\nmodel.eval()\nre.compile('a')\nbuiltins.exec(c)\n")
    names = [(_dotted(c.func), isinstance(c.func, ast.Name)) for c in _calls(tree)]
    assert ("eval", True) in names and ("exec", True) in names and ("builtins.exec", False) in names
    assert ("model.eval", False) in names and ("re.compile", False) in names
