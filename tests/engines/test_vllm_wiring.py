"""``rollout.engine=vllm`` and ``eval --engine vllm``: the trainer's rollouts come from the vLLM engines
(the dual engine for tandem arms, a plain one for solo arms) and the senior's weights reach them after
every update and on resume; evaluation samples its solo and handoff chains there.

The engines here are stand-ins with ``vllm.LLM``'s ``generate`` backed by the in-process engine (a dual
stand-in writes junior tokens as id + V, as the real dual model does); the real engines are exercised
by the slow tests of ``tests/engines/test_vllm_dual.py`` and ``tests/engines/test_vllm.py``.
"""

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.tiny_models import make_tiny_model
from helpers.trainers import EXAMPLES, length_reward

from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.engines.handoff import Schedule, make_schedule, token_table
from tandem_rlvr.engines.rollout import generate
from tandem_rlvr.engines.types import Sampling
from tandem_rlvr.engines.vllm_backend import VLLMEngine
from tandem_rlvr.engines.vllm_dual import DualVLLMEngine
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.training.trainer import make_trainer

NEAR_GREEDY = 1e-5  # the trainer needs temperature > 0; this close to 0 sampling is the argmax


def _sampling(params) -> Sampling:
    """The call's sampling (NEAR_GREEDY as greedy, so that rollouts can be compared with the in-process engine's)."""
    t, top_p, top_k = params[0].temperature, params[0].top_p, params[0].top_k
    assert all((sp.temperature, sp.top_p, sp.top_k) == (t, top_p, top_k) for sp in params)
    return Sampling(max(sp.max_tokens for sp in params), 0 if t == NEAR_GREEDY else t, top_p, top_k)


def _pad(tok, reqs):
    enc = tok.pad({"input_ids": [r["prompt_token_ids"] for r in reqs]}, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _outputs(rows):
    return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=r)]) for r in rows]


class DualStandIn:
    """A dual engine's ``vllm.LLM``: the in-process engine over its own copies of both models, the schedule and
    coins of each call's ``extra_args["tandem"]``, junior tokens written as id + V, a row that reaches
    ``max_rounds`` ended by the sentinel 2V."""

    def __init__(self, senior, junior, tok):
        self.senior, self.junior, self.tok = copy.deepcopy(senior), junior, tok
        self.tandem_vocab = V = len(tok)
        self.requests = 0
        self.V = V

    def generate(self, reqs, params, use_tqdm=False):
        self.requests += len(reqs)
        a = params[0].extra_args["tandem"]
        assert all(sp.extra_args["tandem"]["b"] == b for b, sp in enumerate(params)) and a["n"] == len(reqs)
        schedule = Schedule.from_dict(a, token_table(self.tok))  # the round trip the dual engine's processor makes
        sampling = _sampling(params)
        stop = params[0].stop_token_ids
        ro = generate(self.senior, self.junior if schedule.name != "none" else None, *_pad(self.tok, reqs), schedule,
                      sampling, eos_token_ids=[e for e in stop if e < self.V],
                      junior_eos_token_ids=[e - self.V for e in stop if self.V <= e < 2 * self.V],
                      pad_token_id=self.tok.pad_token_id, seed=a["seed"], max_rounds=a["max_rounds"], record_junior=False)
        rows = []
        for b in range(len(reqs)):
            n = int(ro.response_mask_BT[b].sum())
            row = [i if o else i + self.V for i, o in zip(ro.response_ids_BT[b, :n].tolist(), ro.owner_BT[b, :n].tolist())]
            if not bool(ro.finished_B[b]) and n < sampling.max_new_tokens:
                row.append(2 * self.V)
            rows.append(row)
        return _outputs(rows)

    def reset_prefix_cache(self):
        pass


class StandInDual(DualVLLMEngine):
    """The dual engine over a :class:`DualStandIn`: pushes and solo switches recorded, not sent to a worker."""

    def __init__(self, llm, tok, **kw):
        super().__init__(llm, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                         sampling_params_cls=lambda **k: SimpleNamespace(**k), **kw)
        self.pushes: list[dict[str, torch.Tensor]] = []
        self.solo_calls: list[bool] = []

    def set_solo(self, solo: bool) -> None:
        self.solo_calls.append(solo)

    def _load_senior(self, model) -> None:
        from tandem_rlvr.engines.weights import engine_weights

        with engine_weights(model) as weights:
            pushed = {n: w.detach().clone() for n, w in weights}
        self.llm.senior.load_state_dict(pushed, strict=False)
        self.pushes.append(pushed)


class SoloStandIn:
    """A plain engine's ``vllm.LLM``: greedy solo decoding of its own copy of the senior."""

    def __init__(self, model, tok):
        self.model, self.tok = copy.deepcopy(model), tok

    def generate(self, reqs, params, use_tqdm=False):
        ro = generate(self.model, None, *_pad(self.tok, reqs), make_schedule("none"), _sampling(params),
                      eos_token_ids=params[0].stop_token_ids, pad_token_id=self.tok.pad_token_id)
        return _outputs([ro.response_ids_BT[b, :int(ro.response_mask_BT[b].sum())].tolist() for b in range(len(reqs))])


@pytest.fixture(scope="module")
def models(tokenizer):
    return make_tiny_model(len(tokenizer), 0, 48), freeze(make_tiny_model(len(tokenizer), 1, 32))


def _cfg(tmp_path, arm, engine, *extra, temperature=NEAR_GREEDY):
    over = [f"algo.arm={arm}", "model.senior=unused", "model.junior=unused", "train.steps=2",
            "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=16",
            f"rollout.temperature={temperature}", f"rollout.engine={engine}", f"train.out_dir={tmp_path / engine}",
            "algo.lr=1e-3", "train.save_every=1", "train.progress=false", *extra]
    if arm == "trlvr":
        over += ["handoff.schedule=word", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]"]
    return load_config(None, over)


def _trainer(cfg, tokenizer, models, engine=None):
    s, j = models
    return make_trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                   examples=EXAMPLES, vllm_engine=engine)


def _engine(arm, tokenizer, models):
    if arm == "trlvr":
        return StandInDual(DualStandIn(*models, tokenizer), tokenizer)
    return VLLMEngine(SoloStandIn(models[0], tokenizer), eos_token_ids=[tokenizer.eos_token_id],
                      pad_token_id=tokenizer.pad_token_id, sampling_params_cls=lambda **k: SimpleNamespace(**k))


@pytest.mark.parametrize("arm", ["trlvr", "grpo"])
def test_training_rollouts_come_from_the_engines_and_match_in_process(tmp_path, tokenizer, models, arm):
    ref = _trainer(_cfg(tmp_path, arm, "hf"), tokenizer, models).rollout(0)[0]
    got = _trainer(_cfg(tmp_path, arm, "vllm"), tokenizer, models, _engine(arm, tokenizer, models)).rollout(0)[0]
    for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "finished_B", "turn_author_BT", "decisions_B",
                 "senior_decisions_B"):
        assert torch.equal(getattr(ref, name).long(), getattr(got, name).long()), name
    owners = got.owner_BT[got.response_mask_BT.bool()]
    if arm == "trlvr":
        assert 0 < float(owners.float().mean()) < 1, "the word schedule must hand off in this fixture"
    else:
        assert bool(owners.all())


def test_the_dual_engine_ends_a_row_on_each_authors_own_eos(tokenizer, models):
    """A junior whose EOS (X) is not the senior's: the dual engine stops a request on X only where the junior writes
    it (sampled as X + V), and replays such a row as ended, as the in-process engine does."""
    from tandem_rlvr.engines.base import PromptBatch
    from tandem_rlvr.engines.inprocess import InProcessEngine
    from helpers.tiny_models import bias_token

    X, V = 7, len(tokenizer)
    senior, junior = (bias_token(copy.deepcopy(m), X, 50.0) for m in models)
    engine = StandInDual(DualStandIn(senior, junior, tokenizer), tokenizer, junior_eos_token_ids=[X])
    schedule, sampling = make_schedule("bernoulli", p=0.5), Sampling(max_new_tokens=12, temperature=NEAR_GREEDY)
    stop = engine._params(schedule, sampling, 0, 1, 0, None).stop_token_ids
    assert X + V in stop and X not in stop and tokenizer.eos_token_id in stop
    ids = [tokenizer.encode(t) for t in ("What is 3 plus 4?", "hi there", "Tom has 12 apples.")]
    batch = PromptBatch.left_padded(ids, tokenizer.pad_token_id)
    got = engine.generate(batch, schedule, sampling, seed=3)
    ref = InProcessEngine(senior, junior, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                          junior_eos_token_ids=[X]).generate(batch, schedule, Sampling(12, 0), seed=3)
    for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "finished_B"):
        assert torch.equal(getattr(ref, name).long(), getattr(got, name).long()), name
    assert bool(got.finished_B.all()) and int(got.response_mask_BT.sum(-1).max()) < 12


def test_weights_reach_the_senior_stack_after_every_update_and_on_resume(tmp_path, tokenizer, models):
    engine = _engine("trlvr", tokenizer, models)
    tr = _trainer(_cfg(tmp_path, "trlvr", "vllm", temperature=1.0), tokenizer, models, engine)
    tr.train()
    assert len(engine.pushes) == 2
    assert all(torch.equal(a, b) for a, b in zip(engine.llm.junior.parameters(), models[1].parameters())), \
        "the junior stack is never pushed"
    final = dict(tr.acc.unwrap_model(tr.senior).named_parameters())
    start = dict(models[0].named_parameters())
    assert any(not torch.equal(final[n].detach(), start[n].detach()) for n in final), "the senior must have trained"
    for n, w in engine.pushes[-1].items():
        assert torch.equal(w, final[n].detach()), n
    first, second = engine.pushes
    assert any(not torch.equal(first[n], second[n]) for n in first), "each push carries that step's update"

    resumed = _engine("trlvr", tokenizer, models)
    tr2 = _trainer(_cfg(tmp_path, "trlvr", "vllm", "train.steps=3", temperature=1.0), tokenizer, models, resumed)
    tr2.train()
    for n, w in resumed.pushes[0].items():  # on resume, before any rollout: the checkpoint's weights
        assert torch.equal(w, final[n].detach()), n
    assert len(resumed.pushes) == 2


def test_validation_samples_on_the_engine_and_equals_in_process_validation(tmp_path, tokenizer, models):
    """With rollout.engine=vllm the senior-alone validation runs on the run's engine (the senior stack alone),
    not on a gathered in-process copy; same seeds, so the same val/ metrics as in-process validation."""
    import json

    from helpers.run_files import write_data

    val = ["val.every=1", f"val.data={write_data(tmp_path / 'val.jsonl')}", "val.n=2", "val.limit=4",
           "val.select=pass@2", "train.save_every=0"]
    rows = {}
    engine = _engine("trlvr", tokenizer, models)
    for kind, eng in (("hf", None), ("vllm", engine)):
        _trainer(_cfg(tmp_path, "trlvr", kind, *val, temperature=1.0), tokenizer, models, eng).train()
        rows[kind] = [json.loads(x) for x in (tmp_path / kind / "metrics.jsonl").read_text().splitlines()]
    vals = [{k: v for k, v in r.items() if k.startswith("val/")} for r in rows["vllm"]]
    assert all(v and "val/pass@2" in v for v in vals)
    assert vals == [{k: v for k, v in r.items() if k.startswith("val/")} for r in rows["hf"]]
    assert engine.solo_calls.count(True) >= 2, "validation ran the senior stack alone, after each step"


@pytest.mark.parametrize("extra,match", [
    (["rollout.engine=sglang"], "must be hf or vllm"),
    (["algo.arm=trlvr", "handoff.schedule=word", "rollout.vllm_timeout_s=0"], "vllm_timeout_s"),
    (["algo.arm=trlvr", "handoff.schedule=step", "model.bridge=true"], "text bridge"),
    (["algo.arm=grpo", "rollout.vllm_memory=0"], "vllm_memory"),
    (["rollout.vllm_processes=true"], "vllm_processes"),  # the two-engine mode is gone: an unknown key
])
def test_vllm_engine_config_errors_name_the_key(extra, match):
    over = ["model.senior=s", "model.junior=j", "rollout.engine=vllm", *extra]
    with pytest.raises(ConfigError, match=match):
        load_config(None, over)


def test_grpo_with_word_schedule_key_is_fine_on_vllm():
    """Solo arms ignore the handoff schedule, so vllm serves them whatever handoff.schedule says."""
    cfg = load_config(None, ["model.senior=s", "model.junior=j", "rollout.engine=vllm", "algo.arm=grpo",
                             "handoff.schedule=word"])
    assert cfg.rollout.engine == "vllm"


def test_evaluation_samples_every_chain_on_the_dual_engine_and_solo_on_the_senior_stack(tokenizer, models):
    from tandem_rlvr.evaluation.evaluate import evaluate_pair

    kw = dict(n=2, sampling=Sampling(16, 0.0), reward_fn=length_reward, curve_ps=[1.0, 0.5], progress=False)
    ref, ref_chains = evaluate_pair(*models, tokenizer, EXAMPLES[:5], **kw)
    engine = _engine("trlvr", tokenizer, models)
    got, got_chains = evaluate_pair(*models, tokenizer, EXAMPLES[:5], engine=engine, **kw)
    assert engine.llm.requests >= 30, "solo, handoff and curve chains come from the engine"
    assert True in engine.solo_calls and False in engine.solo_calls, "solo chains run the senior stack alone"
    assert ref["handoff_rounds"] > 1, "the fixture must hand off"
    assert got == ref
    assert got_chains == ref_chains


def test_eval_on_vllm_starts_one_dual_engine_per_senior_with_the_junior(monkeypatch, tokenizer, models, tmp_path):
    from tandem_rlvr.cli import build_parser
    from tandem_rlvr.engines import vllm_dual
    from tandem_rlvr.evaluation import eval_cli

    s, j = str(tmp_path / "s"), str(tmp_path / "j")  # local folders: the engine reads them as they are
    for d in (s, j):
        Path(d).mkdir()
    made = []
    monkeypatch.setattr(vllm_dual, "make_dual_llm", lambda s, j, **kw: made.append((s, j, kw["max_model_len"])) or "llm")
    monkeypatch.setattr(vllm_dual, "DualVLLMEngine", lambda llm, **kw: ("dual", llm))
    base = ["eval", "--senior", s, "--junior", j, "--benchmark", "gsm8k", "--engine", "vllm"]
    opts = eval_cli.resolve_options(build_parser().parse_args(base))
    assert eval_cli._engine(opts, s, j, "float32", tokenizer, *models, 700) == ("dual", "llm")
    eval_cli._engine(opts, s, j, "float32", tokenizer, *models)
    assert made == [(s, j, 700), (s, j, opts.context)]


class SleepyDual(DualStandIn):
    """A dual stand-in with vLLM's sleep-mode calls, recorded in ``log`` with its rollouts."""

    def __init__(self, *a):
        super().__init__(*a)
        self.log: list[str] = []

    def generate(self, reqs, params, use_tqdm=False):
        self.log.append("generate")
        return super().generate(reqs, params, use_tqdm)

    def sleep(self, level):
        self.log.append(f"sleep({level})")

    def release_kv_cache_memory(self):
        self.log.append("release_kv")

    def wake_up(self, tags=None):
        self.log.append(f"wake{tags}")

    def reset_prefix_cache(self):
        self.log.append("reset_prefix_cache")


@pytest.mark.parametrize("mode, asleep", [
    ("weights", ["sleep(1)", "empty_cache", "wake['weights']", "push", "empty_cache", "wake['kv_cache', 'scheduling']",
                 "reset_prefix_cache"]),
    ("kv", ["sleep(0)", "release_kv", "push", "empty_cache", "wake['kv_cache', 'scheduling']", "reset_prefix_cache"]),
    ("off", ["push", "reset_prefix_cache"]),
])
def test_sleep_mode_gives_memory_to_the_update_and_wakes_for_the_push(tmp_path, tokenizer, models, monkeypatch, mode,
                                                                      asleep):
    """rollout.vllm_sleep on a platform with sleep mode: after each step's rollouts the engine sleeps through the
    update; its weights come back before the push loads the new ones, the KV cache and scheduler after it. PyTorch's
    cached memory goes back to the driver before each wake-up (vLLM maps its memory back past PyTorch's allocator)."""
    from tandem_rlvr.engines import vllm_backend as vb

    monkeypatch.setattr(vb, "_sleep_available", lambda m: m != "off")
    llm = SleepyDual(*models, tokenizer)
    monkeypatch.setattr(vb, "release_cached_memory", lambda: llm.log.append("empty_cache"))
    engine = StandInDual(llm, tokenizer)
    engine.sleeper = vb.EngineSleep(llm, mode)
    real_load = engine._load_senior
    engine._load_senior = lambda model: (llm.log.append("push"), real_load(model))
    _trainer(_cfg(tmp_path, "trlvr", "vllm", "train.save_every=0", f"rollout.vllm_sleep={mode}"), tokenizer, models,
             engine).train()
    step = ["generate", *asleep]
    assert llm.log == step + step


@pytest.mark.parametrize("cuda", [True, False])
def test_cached_memory_goes_back_to_the_driver_only_where_cuda_runs(monkeypatch, cuda):
    from tandem_rlvr.engines import vllm_backend as vb

    freed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(1))
    vb.release_cached_memory()
    assert freed == ([1] if cuda else [])


class _Faulty:
    """A stand-in engine whose ``generate`` raises, or hangs, from its ``at``-th call on (mixed in first)."""

    def __init__(self, *a, fault: str, at: int):
        import threading

        super().__init__(*a)
        self.fault, self.at, self.calls = fault, at, 0
        self.release = threading.Event()  # a hung call waits for it, then fails (no work left running at exit)

    def generate(self, reqs, params, use_tqdm=False):
        self.calls += 1
        if self.calls >= self.at:
            if self.fault == "hang":
                self.release.wait(60)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().generate(reqs, params, use_tqdm)


class FaultyDual(_Faulty, DualStandIn):
    """A dual stand-in that raises, or hangs, from its ``at``-th call on."""


class FaultySolo(_Faulty, SoloStandIn):
    """A solo stand-in that raises, or hangs, from its ``at``-th call on; pushes reach its model through a
    stand-in of vLLM's worker."""

    def __init__(self, *a, fault: str, at: int):
        super().__init__(*a, fault=fault, at=at)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            reload_weights=self._reload)))

    def _reload(self, weights_iterator, is_checkpoint_format):
        self.model.load_state_dict(dict(weights_iterator), strict=False)

    def reset_prefix_cache(self):
        pass


@pytest.mark.parametrize("arm", ["trlvr", "grpo"])
@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_an_engine_fault_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, tokenizer, models, fault, arm):
    """A rollout that raises, or that does not finish within rollout.vllm_timeout_s, stops the run with one
    EngineFault naming what happened, on the dual engine (trlvr) and on the solo one (grpo); the checkpoint
    of the last finished step is intact and complete."""
    from tandem_rlvr.engines.vllm_dual import EngineFault
    from tandem_rlvr.training.checkpoint import complete_checkpoints

    if arm == "trlvr":
        llm = FaultyDual(*models, tokenizer, fault=fault, at=3)
        engine = StandInDual(llm, tokenizer)
    else:
        llm = FaultySolo(models[0], tokenizer, fault=fault, at=3)
        engine = VLLMEngine(llm, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                            sampling_params_cls=lambda **k: SimpleNamespace(**k))
    engine.timeout_s = 1.0
    cfg = _cfg(tmp_path, arm, "vllm", "train.steps=4", "rollout.vllm_timeout_s=1", temperature=1.0)
    tr = _trainer(cfg, tokenizer, models, engine)
    try:
        with pytest.raises(EngineFault, match="illegal memory access" if fault == "raise" else "within 1 s"):
            tr.train()
    finally:
        llm.release.set()
    run = tmp_path / "vllm"
    assert [d.name for d in complete_checkpoints(run)] == ["step-1", "step-2"]  # rollouts 1 and 2 finished
    assert not list((run / "checkpoints").glob(".tmp-*"))
