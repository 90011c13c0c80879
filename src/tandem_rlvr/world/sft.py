"""Supervised warm starts of the world's small causal LMs on generated step-by-step solutions.

Each model is a Qwen3-architecture transformer from a ``transformers`` config, trained from a fixed
seed on an endless stream of (prompt, solution) pairs from the train bucket. The loss covers only the
assistant response (solution + ``<|im_end|>``). Batches draw one chain length each, so that padding
stays small; the learning rate warms up, then decays by a cosine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from tandem_rlvr.data import render_prompt
from tandem_rlvr.seeds import ROW_WEIGHTS, derive_seed
from tandem_rlvr.world.problems import Problem
from tandem_rlvr.world.registry import DEFAULT_WORLD, get_world


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and supervised-training recipe of one warm-started model."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int = 2  # few wide heads copy digits far more precisely than many narrow ones
    kv_heads: int = 1
    steps: int = 300
    batch: int = 8
    lr: float = 6e-3
    warmup: int = 50
    jargon_share: float = 0.0  # share of training solutions written in the jargon style...
    jargon_from: int = 0  # ...from this step on (plain only before: a curriculum)
    n_ops: tuple[int, int] = (2, 8)
    short_steps: int = 0  # a length curriculum: the first ``short_steps`` batches use short_ops chains,
    short_ops: tuple[int, int] = (2, 4)  # then the longest length grows by one every ``ramp_every`` steps
    ramp_every: int = 0
    seed: int = 0

    def to_dict(self) -> dict:
        """A JSON-serialisable view (for the cache key and the manifest)."""
        return asdict(self)


def make_model(spec: ModelSpec, tokenizer) -> torch.nn.Module:
    """A freshly initialised Qwen3 causal LM for ``spec`` (seeded), with the tokenizer's special ids."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


class BatchMaker:
    """Turns fresh train-bucket problems into right-padded (input_ids, attention_mask, labels) batches.

    Each batch has one chain length (drawn uniformly from ``spec.n_ops``), which keeps padding small.
    """

    def __init__(self, tokenizer, spec: ModelSpec, world: str = DEFAULT_WORLD):
        """Seed the batch RNG from ``spec.seed`` (deterministic stream per spec); ``world`` names the built-in world
        whose recipe gives the problems and the targets (``train_problem``, ``sft_response``:
        :class:`tandem_rlvr.world.registry.World`)."""
        recipe = get_world(world).recipe_module()
        self.tok = tokenizer
        self.train_problem, self.sft_response = recipe.train_problem, recipe.sft_response
        self.world = world
        self.spec = spec
        self.rng = random.Random(derive_seed(spec.seed, 1, weights=(1, ROW_WEIGHTS[0])))  # seed + 7919: part of every recipe
        self.eos = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        self.step = 0

    def _response(self, problem: Problem) -> str:
        """The target response, compressed with probability ``jargon_share`` once ``jargon_from`` is reached
        (the whole solution in the arith world, each step alone in the shorthand world)."""
        share = self.spec.jargon_share if self.step >= self.spec.jargon_from else 0.0
        return self.sft_response(problem, self.rng, share) + self.eos

    def ops_range(self, step: int) -> tuple[int, int]:
        """The chain lengths of the batch at ``step`` under the length curriculum."""
        spec = self.spec
        if step < spec.short_steps:
            return spec.short_ops
        if spec.ramp_every <= 0:
            return spec.n_ops
        longest = spec.short_ops[1] + 1 + (step - spec.short_steps) // spec.ramp_every
        return spec.n_ops[0], min(spec.n_ops[1], longest)

    def next(self) -> dict[str, torch.Tensor]:
        """The next batch; labels are -100 on the prompt and on padding."""
        n_ops = self.rng.randint(*self.ops_range(self.step))
        problems = [self.train_problem(self.rng, n_ops) for _ in range(self.spec.batch)]
        pairs = [(render_prompt(self.tok, p.text), self._response(p)) for p in problems]
        self.step += 1
        prompts = self.tok([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
        responses = self.tok([r for _, r in pairs], add_special_tokens=False)["input_ids"]
        length = max(len(p) + len(r) for p, r in zip(prompts, responses))
        ids = torch.full((len(pairs), length), self.pad_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        mask = torch.zeros_like(ids)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(r)
            mask[i, : len(seq)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def lr_at(step: int, spec: ModelSpec) -> float:
    """Linear warmup to ``spec.lr``, then cosine decay to 10 % of it."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    frac = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_sft(
    spec: ModelSpec, tokenizer, on_step: Callable[[int, float], None] | None = None, world: str = DEFAULT_WORLD
) -> torch.nn.Module:
    """Train a fresh model for ``spec`` on ``world``'s styles and return it in eval mode; ``on_step(step, loss)``
    reports progress."""
    model = make_model(spec, tokenizer)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)
    batches = BatchMaker(tokenizer, spec, world)
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        loss = model(**batches.next()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step(step, float(loss.detach()))
    return model.eval()
