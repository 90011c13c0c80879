"""scripts/gpu_check.py and gpu_check.sh: each arm in its own process with this checkout on PYTHONPATH, each arm's
JSON written after every step, a time budget, a memory estimate that refuses an arm the GPU cannot hold (a 4B model's
float32 training state and engine need an H200; the 1.7B shape fits 80 GB), --paper-step bounded, the interpreter used as it is, and on a machine without vLLM the in-process arms (and it says so)."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from helpers.paths import ROOT

QWEN3_4B_CONFIG = {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True}
QWEN3_1_7B_CONFIG = {**QWEN3_4B_CONFIG, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                     "num_attention_heads": 16}
GIB80, GIB139 = 80 * 2**30, 139 * 2**30  # an H100's and an H200's memory as torch reports them


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model_4b(tmp_path, config=QWEN3_4B_CONFIG):
    d = tmp_path / f"qwen3-{config['num_hidden_layers']}-layers"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def test_paper_step_is_one_gpu_share_of_a_paper_step_bounded_in_time(gpu_check, tmp_path):
    from tandem_rlvr.config import load_config

    args = gpu_check.parse_args(["--paper-step"])
    paper = load_config("paper/trlvr")
    cfg = gpu_check.make_config(args, "trlvr", "m", tmp_path, "vllm")
    per_gpu = paper.train.prompts_per_step * paper.algo.group_size // 2  # two GPUs
    assert args.random_4b and args.prompts * args.group_size == per_gpu == 64
    assert args.steps == 2 and args.max_new_tokens == 1024 < paper.rollout.max_new_tokens, "bounded: ends in a slot"
    assert gpu_check.parse_args(["--paper-step", "--max-new-tokens", "3000"]).max_new_tokens == 3000
    r, pr = cfg.rollout, paper.rollout
    assert (r.temperature, r.engine, r.vllm_sleep) == (pr.temperature, "vllm", pr.vllm_sleep)
    assert r.vllm_memory == 0.4 < pr.vllm_memory, "one unsharded GPU holds the whole trainer beside the engine"
    assert (cfg.handoff.schedule, cfg.handoff.p, cfg.handoff.max_gap) == ("word", 0.5, 32)
    assert cfg.algo.micro_batch == paper.algo.micro_batch == 1 and cfg.model.gradient_checkpointing
    assert gpu_check.memory_note(args, {"gpu_bytes": GIB139, "model": _model_4b(tmp_path)}) is None, "fits an H200"
    assert gpu_check.memory_note(args, {"gpu_bytes": GIB80, "model": _model_4b(tmp_path)}) is not None


def _need_gb(note: str) -> float:
    return float(note.split("need ")[1].split(" GB")[0])


def test_a_4b_model_does_not_fit_80_gb_the_1_7b_shape_does(gpu_check, tmp_path):
    """float32 weights, gradients and AdamW states (16 B a parameter) and the bf16 junior (2 B): 72 GB for 4.02 B
    parameters before the engine's 0.3 x 80 GiB (a review: the estimate said 10 B a parameter and the junior ran in
    float32, so the check would have run out of memory on an H100 while its warning stayed silent)."""
    env = {"gpu_bytes": GIB80, "model": _model_4b(tmp_path)}
    args = gpu_check.parse_args(["--random-4b"])
    assert (args.micro_batch, args.gradient_checkpointing, args.max_new_tokens, args.vllm_memory) == (8, True, 512, 0.3)
    note = gpu_check.memory_note(args, env)
    assert note is not None and "--random-1.7b" in note and 95 <= _need_gb(note) <= 101, note
    small = {"gpu_bytes": GIB80, "model": _model_4b(tmp_path, QWEN3_1_7B_CONFIG)}
    assert gpu_check.memory_note(gpu_check.parse_args(["--random-1.7b"]), small) is None
    assert gpu_check.memory_note(args, {"gpu_bytes": GIB139, "model": _model_4b(tmp_path)}) is None
    note = gpu_check.memory_note(gpu_check.parse_args(["--random-1.7b", "--micro-batch", "32",
                                                       "--no-gradient-checkpointing"]), small)
    assert note is not None and "micro-batch" in note


def test_the_junior_is_bf16_beside_float32_weights_on_a_gpu(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = gpu_check.make_config(gpu_check.parse_args(["--random-1.7b"]), "trlvr", "m", tmp_path)
    assert (cfg.model.dtype, cfg.model.mixed_precision, cfg.model.junior_dtype) == ("float32", "bf16", "bfloat16")


def test_an_arm_the_gpu_cannot_hold_is_refused_before_it_starts(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "vllm_found", lambda: False)
    out = tmp_path / "out"

    def prepare(cmd, timeout_s):
        assert "prepare" in cmd, "no arm may start"
        gpu_check.write_json(out / "env.json", {"device": "H100", "gpu_bytes": GIB80, "model": _model_4b(tmp_path)})
        return "ok"

    monkeypatch.setattr(gpu_check, "run_child", prepare)
    assert gpu_check.main(["--random-4b", "--out", str(out)]) == 2
    assert "no arm was started" in capsys.readouterr().err


def test_each_arm_is_a_process_of_its_own_vllm_first_and_without_vllm_the_in_process_arms(gpu_check):
    args = gpu_check.parse_args(["--random-4b"])
    assert gpu_check.arm_specs(args, found=True) == ["vllm/trlvr", "vllm/grpo", "hf/trlvr", "hf/grpo"]
    assert gpu_check.arm_specs(args, found=False) == ["hf/trlvr", "hf/grpo"]
    one = gpu_check.parse_args(["--random-4b", "--engines", "hf", "--arms", "grpo"])
    assert gpu_check.arm_specs(one, found=True) == ["hf/grpo"]


def test_asking_for_vllm_where_it_is_not_installed_is_refused(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "vllm_found", lambda: False)
    monkeypatch.setattr(gpu_check, "run_child", lambda *a: pytest.fail("no child may start"))
    assert gpu_check.main(["--random-4b", "--engines", "vllm", "--out", str(tmp_path)]) == 2
    assert "vLLM was not found" in capsys.readouterr().err


def test_children_import_this_checkout_from_pythonpath(gpu_check, tmp_path):
    """vLLM inspects the plugin model in a subprocess of its own: only the environment reaches it."""
    env = gpu_check.child_env({"PYTHONPATH": "/elsewhere", "PATH": os.environ["PATH"]})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT / "src"), "/elsewhere"]
    code = "import tandem_rlvr.errors as e, sys; print(e.__file__)"
    got = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == str(ROOT / "src" / "tandem_rlvr" / "errors.py")


def test_a_child_and_its_own_children_are_stopped_at_the_budget(gpu_check, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    t0 = time.monotonic()
    assert gpu_check.run_child([sys.executable, "-c", code], 3) == "stopped at the budget"
    assert time.monotonic() - t0 < 60
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once its group got SIGTERM
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the child's own child outlived the budget")
    assert gpu_check.run_child([sys.executable, "-c", "raise SystemExit(3)"], 30) == "exit 3"


def _arm_doc(engine, arm, steps, complete=True):
    rows = [{"wall_s": w, "time/rollout_s": r, "time/update_s": w - r, "rollout/senior_token_frac": 0.5,
             "peak_gpu_gib": None, "prompt_lens": [10, 10], "response_lens": [n, n]} for w, r, n in steps]
    return {"engine": engine, "arm": arm, "load_s": 1.0, "steps": rows, "complete": complete, "stopped": None,
            "env": {"device": "cpu", "peak_bw": None}, "args": {"max_new_tokens": 64, "dtype": "float32"}}


def test_the_report_holds_what_was_measured_when_arms_fail_or_the_budget_ends(gpu_check, tmp_path, monkeypatch):
    """Four arms: one whole, one stopped at the budget after a step, one crashed before writing, one never started
    (the budget spent). The report keeps the three JSONs' measurements and says what happened to each arm."""
    clock = [1000.0]
    monkeypatch.setattr(gpu_check.time, "time", lambda: clock[0])
    monkeypatch.setattr(gpu_check, "vllm_found", lambda: True)
    out = tmp_path / "out"
    fates = {"vllm/trlvr": ("ok", [(9.0, 5.0, 40), (6.0, 4.0, 40)]), "vllm/grpo": ("stopped at the budget", [(4.0, 2.0, 40)]),
             "hf/trlvr": ("exit 1", None)}

    def fake_child(cmd, timeout_s):
        extra = cmd[cmd.index("--child") + 1:]
        if extra[0] == "prepare":
            gpu_check.write_json(out / "env.json", {"device": "cpu", "gpu_gib": None, "torch": "t", "cuda": None,
                                                    "model": str(tmp_path / "no-model")})
            return "ok"
        spec = extra[extra.index("--arm-spec") + 1]
        status, steps = fates[spec]
        if steps:
            gpu_check.write_json(gpu_check.arm_path(out, spec), _arm_doc(*spec.split("/"), steps, status == "ok"))
        clock[0] += 25.0
        return status

    monkeypatch.setattr(gpu_check, "run_child", fake_child)
    rc = gpu_check.main(["--random-4b", "--budget-s", "100", "--out", str(out)])
    summary = json.loads((out / "gpu_check.json").read_text())
    assert rc == 1, "an arm crashed"
    assert summary["status"] == {"vllm/trlvr": "ok", "vllm/grpo": "stopped at the budget", "hf/trlvr": "exit 1",
                                 "hf/grpo": "not run: the budget was spent"}
    assert set(summary["arms"]) == {"vllm/trlvr", "vllm/grpo"}
    t, g = summary["arms"]["vllm/trlvr"], summary["arms"]["vllm/grpo"]
    assert (t["timed_steps"], t["step_s"], g["timed_steps"], g["step_s"]) == (1, 6.0, 1, 4.0), "warm-up step dropped"
    assert summary["ratios"]["step_time_trlvr_over_grpo/vllm"] == pytest.approx(6.0 / 4.0)
    # 80 tokens in 4 s of rollout against 80 in 2 s
    assert summary["ratios"]["gen_tokens_per_s_trlvr_over_grpo/vllm"] == pytest.approx((80 / 4) / (80 / 2))


class _FakeTrainer:
    """train_step calls rollout (as the trainer does) and returns a metrics row; step ``fail_at`` raises."""

    def __init__(self, fail_at, wall_s=0.0):
        self.fail_at, self.wall_s = fail_at, wall_s

    def rollout(self, step):
        mask = torch.ones(2, 3 + step)
        return SimpleNamespace(prompt_mask_BP=torch.ones(2, 5), response_mask_BT=mask), [0, 1]

    def train_step(self, step):
        if step == self.fail_at:
            raise RuntimeError("CUDA out of memory")
        self.rollout(step)
        time.sleep(self.wall_s)
        return {"time/rollout_s": 0.5, "time/update_s": 0.5, "rollout/response_len": 3.0 + step,
                "rollout/senior_token_frac": 0.5, "text": "not a number"}


def _arm_args(gpu_check, tmp_path, *extra):
    gpu_check.write_json(tmp_path / "env.json", {"device": "cpu", "model": "unused"})
    return gpu_check.parse_args(["--cpu-smoke", "--steps", "3", "--out", str(tmp_path), "--child", "arm",
                                 "--arm-spec", "hf/grpo", *extra])


def test_an_arm_writes_its_json_after_every_step_so_a_crash_keeps_the_steps_before_it(gpu_check, tmp_path, monkeypatch):
    from tandem_rlvr.training import trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "make_trainer", lambda cfg, **kw: _FakeTrainer(fail_at=1))
    args = _arm_args(gpu_check, tmp_path)
    args.steps = 3
    with pytest.raises(RuntimeError, match="out of memory"):
        gpu_check.run_arm(args)
    doc = json.loads((tmp_path / "arm_hf_grpo.json").read_text())
    assert len(doc["steps"]) == 1 and doc["complete"] is False
    assert doc["steps"][0]["response_lens"] == [3, 3] and doc["steps"][0]["prompt_lens"] == [5, 5]


def test_an_arm_stops_before_a_step_that_would_end_after_the_budget(gpu_check, tmp_path, monkeypatch):
    from tandem_rlvr.training import trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "make_trainer", lambda cfg, **kw: _FakeTrainer(fail_at=-1, wall_s=0.3))
    args = _arm_args(gpu_check, tmp_path, "--deadline", str(time.time() + 0.4))
    args.steps = 3
    assert gpu_check.run_arm(args) == 0
    doc = json.loads((tmp_path / "arm_hf_grpo.json").read_text())
    assert len(doc["steps"]) == 1 and doc["complete"] is True and "budget" in doc["stopped"]


def test_achieved_bandwidth_is_the_cost_models_bytes_over_the_rollout_time(gpu_check):
    shape = {"params": 1e9, "kv_per_token": 2e5}  # bf16 bytes a token, one stack
    row = {"prompt_lens": [10, 10], "response_lens": [2, 4], "time/rollout_s": 8.0}
    # two stacks in bf16: weights 1e9 x 2 B x 2 = 4e9 B per decode step, 4 steps (the longest response) = 16e9;
    # KV 4e5 B a token: row 1 reads 2 x 10 + 1 = 21 tokens over its 2 steps, row 2 4 x 10 + 6 = 46: 67 x 4e5
    want = (16e9 + 67 * 4e5) / 8.0
    assert gpu_check.achieved_bandwidth(row, shape, stacks=2, dtype_bytes=2) == pytest.approx(want, rel=1e-12)


def _run_sh(tmp_path, *args, python=sys.executable, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=python, GPU_CHECK_VENV=str(tmp_path / "venv"), HF_HUB_OFFLINE="1")
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


def _check_smoke(tmp_path, arms, *extra):
    out = tmp_path / "out"
    res = _run_sh(tmp_path, "--cpu-smoke", "--out", str(out), *extra)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-3000:]
    assert "a virtual environment: used as it is" in text and not (tmp_path / "venv").exists()
    assert "vLLM was not found" in text, "this interpreter has torch and no vLLM: it says so"
    assert sorted(p.name for p in out.glob("arm_*.json")) == sorted(f"arm_hf_{a}.json" for a in arms)
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["status"] == {f"hf/{a}": "ok" for a in arms}
    for a in arms:
        doc = json.loads((out / f"arm_hf_{a}.json").read_text())
        assert doc["complete"] and doc["steps"] and doc["env"]["device"] == "cpu"
    return summary


def test_gpu_check_sh_uses_a_virtual_environment_as_it_is(tmp_path):
    """The interpreter of this test run is a venv with torch: no venv is made on top of it (one would not see
    its torch), and the check starts with it."""
    res = _run_sh(tmp_path, "--help")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"using {sys.executable} (a virtual environment: used as it is)" in res.stdout
    assert "usage: gpu_check.py" in res.stdout and not (tmp_path / "venv").exists()


def test_gpu_check_sh_never_installs_torch(tmp_path):
    """A base interpreter without torch: a clear stop naming it, no venv, no pip."""
    base = subprocess.run([sys.executable, "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    python = os.path.join(base, "bin", "python3")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{python} imports torch")
    res = _run_sh(tmp_path, "--cpu-smoke", python=python)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "cannot import torch" in res.stderr and "install a CUDA build of torch" in res.stderr
    assert not (tmp_path / "venv").exists() and "installing" not in res.stdout


@pytest.mark.slow
def test_cpu_smoke_through_gpu_check_sh_without_vllm(tmp_path):
    """Each arm in its own process on the CPU, one JSON per arm, and "vLLM was not found" (~1 min)."""
    summary = _check_smoke(tmp_path, ["trlvr", "grpo"])
    assert "step_time_trlvr_over_grpo/hf" in summary["ratios"]
