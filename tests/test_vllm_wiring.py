"""``rollout.engine=vllm`` and ``eval --engine vllm``: the trainer's rollouts come from the vLLM engines
and the senior's weights reach them after every update and on resume; evaluation samples its solo and
step-handoff chains there.

The engines here are stand-ins with ``vllm.LLM``'s surface (``generate``, ``collective_rpc``,
``reset_prefix_cache``) backed by the in-process engine; the real engines are exercised by the slow
tests of ``tests/test_vllm.py``.
"""

import copy
from types import SimpleNamespace

import pytest
import torch
from test_trainer import EXAMPLES, length_reward
from test_vllm import GreedyStandIn

from tandem_rlvr.engines.bridge import decode_turn
from tandem_rlvr.config import ConfigError, load_config
from tandem_rlvr.models import Pair, freeze
from tandem_rlvr.engines.handoff import make_schedule
from tandem_rlvr.engines.rollout import Sampling, generate
from tandem_rlvr.training.trainer import Trainer
from tandem_rlvr.engines.vllm_backend import VLLMEngine
from conftest import make_tiny_model

NEAR_GREEDY = 1e-5  # the trainer needs temperature > 0; this close to 0 sampling is the argmax


class EngineStandIn:
    """An engine that decodes greedily with its own copy of the weights and records each push."""

    def __init__(self, model, tok):
        self.model = copy.deepcopy(model)
        self.inner = GreedyStandIn(self.model, tok)
        self.pushes: list[dict[str, torch.Tensor]] = []
        self.cache_resets = 0
        self.requests = 0

    def generate(self, reqs, params, use_tqdm=False):
        self.requests += len(reqs)
        if all(sp.temperature == 0 for sp in params):
            return self.inner.generate(reqs, params)
        if all(sp.temperature == NEAR_GREEDY for sp in params):
            return self.inner.generate(reqs, [SimpleNamespace(**{**vars(sp), "temperature": 0}) for sp in params])
        gen = torch.Generator().manual_seed(params[0].seed)  # sampled: a turn (or a whole solo answer) per request
        budgets = [sp.max_tokens for sp in params]
        if params[0].stop:
            turns = decode_turn(self.inner.side, [r["prompt_token_ids"] for r in reqs], budgets,
                                Sampling(1, params[0].temperature), gen)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=t.ids)]) for t in turns]
        tok = self.inner.tok
        enc = tok.pad({"input_ids": [r["prompt_token_ids"] for r in reqs]}, return_tensors="pt", padding=True)
        solo = generate(self.model, None, enc["input_ids"], enc["attention_mask"], make_schedule("none"),
                        Sampling(max(budgets), params[0].temperature), eos_token_ids=params[0].stop_token_ids,
                        pad_token_id=tok.pad_token_id, seed=params[0].seed)
        n_B = solo.response_mask_BT.sum(-1).tolist()
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=solo.response_ids_BT[b, :n].tolist())])
                for b, n in enumerate(n_B)]

    def collective_rpc(self, method, args=(), kwargs=None):  # vllm_procs.push_weights_file: a safetensors file
        from safetensors.torch import load_file

        from tandem_rlvr.engines.vllm_procs import LOAD_METHOD

        assert method == LOAD_METHOD and not kwargs
        weights = load_file(args[0])
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        assert not unexpected and all("lm_head" in n for n in missing), (missing, unexpected)
        self.pushes.append(weights)
        return [len(weights)]

    def reset_prefix_cache(self):
        self.cache_resets += 1


@pytest.fixture(scope="module")
def models(tokenizer):
    return make_tiny_model(len(tokenizer), 0, 48), freeze(make_tiny_model(len(tokenizer), 1, 32))


def _cfg(tmp_path, arm, engine, *extra, temperature=NEAR_GREEDY):
    over = [f"algo.arm={arm}", "model.senior=unused", "model.junior=unused", "train.steps=2",
            "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=16",
            f"rollout.temperature={temperature}", f"rollout.engine={engine}", f"train.out_dir={tmp_path / engine}",
            "algo.lr=1e-3", "train.save_every=1", "train.progress=false", *extra]
    if arm == "trlvr":
        over += ["handoff.schedule=step", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]"]
    return load_config(None, over)


def _trainer(cfg, tokenizer, models, engines=None):
    s, j = models
    vllm = None
    if engines is not None:
        vllm = VLLMEngine(*engines, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                          sampling_params_cls=lambda **k: SimpleNamespace(**k))
    return Trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                   examples=EXAMPLES, vllm_engine=vllm)


@pytest.mark.parametrize("arm", ["trlvr", "grpo"])
def test_training_rollouts_come_from_the_engines_and_match_in_process(tmp_path, tokenizer, models, arm):
    ref = _trainer(_cfg(tmp_path, arm, "hf"), tokenizer, models).rollout(0)[0]
    engines = (EngineStandIn(models[0], tokenizer), EngineStandIn(models[1], tokenizer))
    got = _trainer(_cfg(tmp_path, arm, "vllm"), tokenizer, models, engines).rollout(0)[0]
    for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "finished_B", "turn_author_BT", "decisions_B", "senior_decisions_B"):
        assert torch.equal(getattr(ref, name).long(), getattr(got, name).long()), name
    owners = got.owner_BT[got.response_mask_BT.bool()]
    if arm == "trlvr":
        assert 0 < float(owners.float().mean()) < 1, "the step schedule must hand off in this fixture"
    else:
        assert bool(owners.all())


def test_weights_reach_the_senior_engine_after_every_update_and_on_resume(tmp_path, tokenizer, models):
    engines = (EngineStandIn(models[0], tokenizer), EngineStandIn(models[1], tokenizer))
    cfg = _cfg(tmp_path, "trlvr", "vllm", temperature=1.0)
    tr = _trainer(cfg, tokenizer, models, engines)
    tr.train()
    senior_engine, junior_engine = engines
    assert len(senior_engine.pushes) == 2 and senior_engine.cache_resets == 2
    assert junior_engine.pushes == [], "the junior's engine is never pushed"
    final = dict(tr.acc.unwrap_model(tr.senior).named_parameters())
    start = dict(models[0].named_parameters())
    assert any(not torch.equal(final[n].detach(), start[n].detach()) for n in final), "the senior must have trained"
    for n, w in senior_engine.pushes[-1].items():
        assert torch.equal(w, final[n].detach()), n
    first, second = senior_engine.pushes
    assert any(not torch.equal(first[n], second[n]) for n in first), "each push carries that step's update"

    resumed_engines = (EngineStandIn(models[0], tokenizer), EngineStandIn(models[1], tokenizer))
    more = _cfg(tmp_path, "trlvr", "vllm", "train.steps=3", temperature=1.0)
    tr2 = _trainer(more, tokenizer, models, resumed_engines)
    tr2.train()
    first = resumed_engines[0].pushes[0]  # on resume, before any rollout: the checkpoint's weights
    for n, w in first.items():
        assert torch.equal(w, final[n].detach()), n
    assert len(resumed_engines[0].pushes) == 2


@pytest.mark.parametrize("extra,match", [
    (["rollout.engine=sglang"], "must be hf or vllm"),
    (["algo.arm=trlvr", "handoff.schedule=word", "rollout.vllm_timeout_s=0"], "vllm_timeout_s"),
    (["algo.arm=trlvr", "handoff.schedule=bernoulli", "rollout.vllm_in_flight=-1"], "vllm_in_flight"),
    (["algo.arm=trlvr", "handoff.schedule=step", "model.bridge=true"], "text bridge"),
    (["algo.arm=grpo", "rollout.vllm_memory=0"], "vllm_memory"),
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


def test_evaluation_samples_solo_and_handoff_chains_on_the_engines(tokenizer, models):
    from tandem_rlvr.evaluation.evaluate import evaluate_pair

    kw = dict(n=2, sampling=Sampling(16, 0.0), reward_fn=length_reward, curve_ps=None, progress=False)
    ref, ref_chains = evaluate_pair(*models, tokenizer, EXAMPLES[:5], **kw)
    engines = (EngineStandIn(models[0], tokenizer), EngineStandIn(models[1], tokenizer))
    engine = VLLMEngine(*engines, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                        sampling_params_cls=lambda **k: SimpleNamespace(**k))
    got, got_chains = evaluate_pair(*models, tokenizer, EXAMPLES[:5], engine=engine, **kw)
    assert engines[0].requests >= 10 and engines[1].requests > 0, "solo and handoff chains come from the engines"
    assert ref["handoff_rounds"] > 1, "the fixture must hand off"
    assert got == ref
    assert got_chains == ref_chains


def test_eval_vllm_processes_flag_places_senior_and_junior_engines(monkeypatch):
    """``tandem-rlvr eval --engine vllm --vllm-processes``: each engine's core in a process of its own, the
    senior's and the junior's on different CPU cores; without the flag both in this process."""
    from tandem_rlvr.cli import build_parser
    from tandem_rlvr.engines import vllm_backend, vllm_procs
    from tandem_rlvr.evaluation import eval_cli

    monkeypatch.setattr(vllm_backend, "_on_cpu", lambda: True)
    monkeypatch.setattr(vllm_procs, "cpu_binds", lambda n: ["0", "1"][:n])
    made = []
    monkeypatch.setattr(vllm_backend, "make_llm", lambda path, **kw: made.append(kw))
    base = ["eval", "--senior", "s", "--junior", "j", "--benchmark", "gsm8k", "--engine", "vllm"]
    for flags, want in ((["--vllm-processes"], [{"processes": True, "cpu_bind": "0"}, {"processes": True, "cpu_bind": "1"}]),
                        ([], [{}, {}])):
        made.clear()
        opts = eval_cli.resolve_options(build_parser().parse_args(base + flags))
        assert opts.vllm_processes is bool(flags)
        eval_cli._vllm_llm(opts, "s", "float32", 0), eval_cli._vllm_llm(opts, "j", "float32", 1)
        assert [{k: kw[k] for k in ("processes", "cpu_bind") if k in kw} for kw in made] == want
