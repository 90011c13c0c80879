"""``tandem_rlvr.trl`` inside TRL 1.16's real ``GRPOTrainer`` (CPU, tiny local models, two steps).

The trainer is built as README.md "Using it from TRL" shows (``rollout_func=make_tandem_rollout(...)``,
``reward_funcs=[reward("boxed_exact"), ...]``). A subclass records the batches ``compute_loss`` trains on
and a wrapper the :class:`Rollout` behind each, so the checks compare TRL's batch with our records:

* the loss mask TRL trains on (``completion_mask * tool_mask``, where TRL puts ``env_mask``) is our owner
  mask, row for row (TRL shuffles the rows of a generation batch; rows are matched by their tokens);
* on that batch TRL's loss and every parameter gradient equal ``core.policy_loss`` with our owner mask;
* moving the old log-prob of junior tokens (their whole contribution to the surrogate) changes no
  gradient, while moving a senior token's does.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from helpers.tiny_models import make_tiny_model  # noqa: E402

from tandem_rlvr.engines.base import PromptBatch  # noqa: E402
from tandem_rlvr.engines.handoff import make_schedule  # noqa: E402
from tandem_rlvr.engines.rollout import generate  # noqa: E402
from tandem_rlvr.engines.types import Sampling  # noqa: E402
from tandem_rlvr.errors import TandemError  # noqa: E402
from tandem_rlvr.rewards import import_reward  # noqa: E402
from tandem_rlvr.training.core import policy_loss, token_logps  # noqa: E402
from tandem_rlvr.trl import make_tandem_rollout, prompt_ids_like_trl, require_trl, reward, trl_batch  # noqa: E402

B, G, MAX_COMPLETION, TEMPERATURE = 4, 2, 10, 0.9
PROMPTS = ["What is 3 plus 4?", "Tom has 12 apples and gives away 5."]


def token_sum_reward(completion_ids, **kwargs):
    """A TRL-style reward that varies with the tokens (the tiny models never write a box)."""
    return [float(sum(ids) % 7) for ids in completion_ids]


def _logps(model, batch) -> torch.Tensor:
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    P = batch["prompt_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
    return token_logps(logits[:, P - 1:-1], batch["completion_ids"], temperature=TEMPERATURE)


class CapturingGRPOTrainer(GRPOTrainer):
    """Records every batch ``compute_loss`` trains on (detached copies)."""

    batches: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        batch = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()}
        with torch.no_grad():
            batch["current_logps"] = _logps(model, batch)  # the weights this step trains
        self.batches.append(batch)
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)


@pytest.fixture(scope="module")
def senior_dir(tmp_path_factory, tokenizer):
    d = tmp_path_factory.mktemp("trl_adapter_senior")
    make_tiny_model(len(tokenizer), seed=3).save_pretrained(str(d))
    tokenizer.save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def run(senior_dir, tokenizer, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    junior = make_tiny_model(len(tokenizer), seed=11)
    tandem = make_tandem_rollout(junior, tokenizer, schedule="bernoulli", p=0.5)
    rollouts = []

    def rollout_func(prompts, trainer):
        out = tandem(prompts, trainer)
        rollouts.append(tandem.last)
        return out

    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl_adapter_out")), report_to=[], use_cpu=True,
                      bf16=False, seed=0, max_steps=2, per_device_train_batch_size=B, num_generations=G,
                      max_completion_length=MAX_COMPLETION, temperature=TEMPERATURE, loss_type="dapo", beta=0.0,
                      learning_rate=1e-2, logging_steps=1, save_strategy="no")  # step 1 visibly moves the weights
    trainer = CapturingGRPOTrainer(
        model=str(senior_dir), args=args, processing_class=tokenizer, rollout_func=rollout_func,
        reward_funcs=[reward("boxed_exact", answer_column="answer"), token_sum_reward],
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2, "answer": ["7", "7"] * 2}))
    trainer.batches = []
    trainer.train()
    return SimpleNamespace(trainer=trainer, tandem=tandem, rollouts=rollouts, batches=trainer.batches)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _rows(ids_BT, mask_BT, other_BT) -> list[tuple[tuple, tuple]]:
    """``(tokens, other)`` per row, cut at the row's length (``mask_BT``)."""
    out = []
    for ids, m, o in zip(ids_BT.tolist(), mask_BT.long().sum(-1).tolist(), other_BT.tolist()):
        out.append((tuple(ids[:m]), tuple(int(x) for x in o[:m])))
    return out


def _our_owner(batch, rollout) -> torch.Tensor:
    """Our owner mask in the row order of TRL's (shuffled) batch, matched by the completion's tokens."""
    pool: dict[tuple, list] = {}
    for ids, own in _rows(rollout.response_ids_BT, rollout.response_mask_BT, rollout.owner_BT):
        pool.setdefault(ids, []).append(own)
    owner = torch.zeros_like(batch["completion_mask"])
    for b, (ids, _) in enumerate(_rows(batch["completion_ids"], batch["completion_mask"], batch["completion_mask"])):
        own = pool[ids].pop()
        owner[b, :len(own)] = torch.tensor(own)
    return owner


def test_trl_trains_two_steps_on_the_owner_mask(run):
    assert run.trainer.state.global_step == 2 and len(run.rollouts) == 2 and len(run.batches) == 2
    for batch, rollout in zip(run.batches, run.rollouts):
        assert "tool_mask" in batch, "TRL dropped env_mask: it would train every token"
        cm, loss_mask = batch["completion_mask"], batch["completion_mask"] * batch["tool_mask"]
        assert int((loss_mask * (1 - cm)).sum()) == 0
        trl_rows = sorted(_rows(batch["completion_ids"], cm, loss_mask))
        our_rows = sorted(_rows(rollout.response_ids_BT, rollout.response_mask_BT, rollout.owner_BT))
        assert trl_rows == our_rows
        live = rollout.response_mask_BT.bool()
        assert bool((rollout.owner_BT[live] == 0).any()) and bool((rollout.owner_BT[live] == 1).any())
    assert 0.0 < run.tandem.last_metrics["rollout/senior_token_frac"] < 1.0


def test_the_senior_is_the_model_trl_trains(run):
    """The senior log-probs recorded while co-writing (TRL's ``sampling_per_token_logps``) are those of the
    weights each step trains: step 2's rollout ran on the weights step 1 updated."""
    first, second = run.batches
    for batch in (first, second):
        cm = batch["completion_mask"].bool()
        scale = float(batch["current_logps"][cm].abs().max())
        torch.testing.assert_close(batch["sampling_per_token_logps"][cm], batch["current_logps"][cm], rtol=0,
                                   atol=1e-4 * scale)
    with torch.no_grad():  # and step 1 did move them (else this check could not tell the weights apart)
        now = _logps(run.trainer.model, second)
    cm = second["completion_mask"].bool()
    assert float((now[cm] - second["current_logps"][cm]).abs().max()) > 1e-2 * float(now[cm].abs().max())


def _trl_loss_and_grads(trainer, inputs):
    model = trainer.model
    loss = GRPOTrainer.compute_loss(trainer, model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _assert_grads_close(a: dict, b: dict) -> None:
    assert set(a) == set(b) and a
    for name, g in a.items():
        scale = float(g.abs().max()) + 1e-12
        torch.testing.assert_close(b[name], g, rtol=0, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}")


def test_trl_loss_equals_ours_and_junior_tokens_get_no_gradient(run):
    trainer, batch = run.trainer, run.batches[-1]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    owner = _our_owner(batch, run.rollouts[-1])
    cm = batch["completion_mask"]
    with torch.no_grad():
        current = _logps(trainer.model, batch)
    g = torch.Generator().manual_seed(0)
    old = ((current + 0.05 * torch.randn(current.shape, generator=g)) * cm).detach()  # ratios != 1, mostly unclipped
    inputs = dict(batch, old_per_token_logps=old)

    trl_loss, trl_grads = _trl_loss_and_grads(trainer, inputs)
    logps = _logps(trainer.model, batch)
    ours, _ = policy_loss(logps, old, batch["advantages"], cm * owner, loss_type="dapo", clip_eps=trainer.epsilon_low,
                          clip_eps_high=trainer.epsilon_high, num_tokens=batch["num_items_in_batch"])
    ours.backward()
    our_grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    torch.testing.assert_close(ours.detach(), trl_loss, rtol=1e-5, atol=1e-6 * (1 + float(trl_loss.abs())))
    _assert_grads_close(trl_grads, our_grads)

    junior = (cm == 1) & (owner == 0) & (batch["advantages"] != 0)[:, None]
    senior = (cm == 1) & (owner == 1) & (batch["advantages"] != 0)[:, None]
    assert junior.any() and senior.any(), "the batch must hold junior and senior tokens of rows with an advantage"
    moved = dict(inputs, old_per_token_logps=old + 0.1 * junior)
    _, grads_junior_moved = _trl_loss_and_grads(trainer, moved)
    _assert_grads_close(trl_grads, grads_junior_moved)
    moved = dict(inputs, old_per_token_logps=old + 0.1 * senior)
    _, grads_senior_moved = _trl_loss_and_grads(trainer, moved)
    assert any(not torch.allclose(grads_senior_moved[n], g) for n, g in trl_grads.items())


def _tiny_rollout(tokenizer, schedule):
    senior, junior = make_tiny_model(len(tokenizer), seed=3), make_tiny_model(len(tokenizer), seed=11)
    batch = PromptBatch.left_padded([tokenizer(p)["input_ids"] for p in PROMPTS], tokenizer.pad_token_id)
    return generate(senior, junior, batch.ids_BP, batch.mask_BP, schedule, Sampling(max_new_tokens=8), seed=1,
                    eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id)


def test_trl_batch_refuses_a_mask_that_disagrees_with_the_schedule(tokenizer):
    schedule = make_schedule("bernoulli", tokenizer, p=0.5)
    rollout = _tiny_rollout(tokenizer, schedule)
    batch, _ = trl_batch(rollout, schedule, 8)
    n_B = rollout.response_mask_BT.sum(-1).tolist()
    assert batch["env_mask"] == [r[:n] for r, n in zip(rollout.owner_BT.tolist(), n_B)]
    rollout.owner_BT = torch.ones_like(rollout.owner_BT)  # a mask that lost the junior's tokens
    with pytest.raises(TandemError, match="ownership mask disagrees"):
        trl_batch(rollout, schedule, 8)
    rollout.turn_author_BT = rollout.decisions_B = None  # no record to check against
    with pytest.raises(TandemError, match="recorded none"):
        trl_batch(rollout, schedule, 8)


def test_rollout_refuses_a_trainer_that_would_drop_env_mask(tokenizer):
    tandem = make_tandem_rollout(make_tiny_model(len(tokenizer), seed=11), tokenizer, schedule="bernoulli")
    trainer = SimpleNamespace(tools=[token_sum_reward], environment_factories=None)
    with pytest.raises(TandemError, match="drops the rollout's env_mask"):
        tandem(PROMPTS, trainer)


def test_prompts_are_tokenized_as_trl_does(tokenizer):
    """Text through the tokenizer, chat messages through the chat template with the generation prompt."""
    trainer = SimpleNamespace(chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                                            "{% if add_generation_prompt %}<assistant>{% endif %}",
                              chat_template_kwargs={})
    assert prompt_ids_like_trl(tokenizer, PROMPTS, trainer) == tokenizer(text=PROMPTS)["input_ids"]
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    ids = prompt_ids_like_trl(tokenizer, chats, trainer)
    assert [tokenizer.decode(r) for r in ids] == [f"<user>{p}\n<assistant>" for p in PROMPTS]


def test_without_trl_the_rollout_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ImportError
    with pytest.raises(TandemError, match=r"pip install 'tandem-rlvr\[trl\]'"):
        require_trl()


def test_builtin_rewards_take_trl_arguments():
    completions = [[{"role": "assistant", "content": "so \\boxed{\\frac{1}{2}}"}],
                   [{"role": "assistant", "content": "\\boxed{8}"}]]
    kw = dict(prompts=[[{"role": "user", "content": "q"}]] * 2, completion_ids=[[1], [2]], trainer_state=None,
              log_extra=None, log_metric=None)
    math = reward("math")
    assert math.__name__ == "math_reward"
    assert math(completions=completions, answer=["0.5", "7"], **kw) == [1.0, 0.0]
    exact = reward("boxed_exact", answer_column="solution")
    assert exact(completions=["\\boxed{7}", "7"], solution=["7", "7"], **kw) == [1.0, 0.0]
    with pytest.raises(TandemError, match="no column 'answer'.*columns: solution"):
        reward("gsm8k")(completions=completions, solution=["1", "2"], **kw)
    with pytest.raises(TandemError, match="unknown reward"):
        reward("maths")


def test_trl_style_reward_in_our_config(tmp_path, monkeypatch):
    (tmp_path / "trl_style_rewards.py").write_text(
        "def exact(prompts, completions, completion_ids, answer, solution, **kwargs):\n"
        "    assert prompts == [None] and completion_ids == [None] and answer == solution\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
        "def two(completions, **kwargs):\n"
        "    return [1.0, 1.0]\n"
        "def plain(completion, gold):\n"
        "    return float(completion == gold)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trl_style_rewards", raising=False)
    fn = import_reward("trl_style_rewards:exact")
    assert fn(" 7 ", "7") == 1.0 and fn("8", "7") == 0.0  # called as our trainer calls it: (completion, gold)
    assert import_reward("trl_style_rewards:plain")("7", "7") == 1.0
    with pytest.raises(TandemError, match="'trl_style_rewards:two' returned 2 rewards for one completion"):
        import_reward("trl_style_rewards:two")("7", "7")


def _snippet_calls(page: str) -> list:
    """The calls of ``make_tandem_rollout`` / ``reward`` in the ```python blocks of ``page``."""
    import ast
    import re

    from helpers.paths import ROOT

    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    calls = [n for b in blocks for n in ast.walk(ast.parse(b)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in ("make_tandem_rollout", "reward")]
    return calls


@pytest.mark.parametrize("page", ["README.md", "docs/trl.md"])
def test_the_documented_snippets_call_the_adapter_as_it_is(page):
    """The snippets (which this module's trainer mirrors) pass arguments the functions take."""
    import inspect

    fns = {"make_tandem_rollout": make_tandem_rollout, "reward": reward}
    calls = _snippet_calls(page)
    assert {c.func.id for c in calls} == set(fns)
    for c in calls:
        inspect.signature(fns[c.func.id]).bind(*[None] * len(c.args), **{k.arg: None for k in c.keywords})
