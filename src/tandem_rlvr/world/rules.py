"""The build rules the built-in worlds share: the build seed, the tokenizer's size and corpus (and how a world's
corpus is laid out), the property gate's tries, how each try seeds its models, how a budget world's gate
measures its two models, and how a gate's checks become its failures and retrained models."""

from __future__ import annotations

from dataclasses import replace

SEED = 1234
TOKENIZER_VOCAB = 1024  # an upper bound: the trainer stops once every pair in the corpus is merged
TOKENIZER_CORPUS = 3000  # problems in the tokenizer corpus
# Every build measures the promised properties (world.properties.PROPERTIES) of what it trained; each model
# whose properties fail is trained again with a seed TRY_SEED_STEP higher (the other is kept), up to
# MAX_TRIES rounds, and every try is recorded in the manifest. Training is seeded and single-threaded, so
# one machine retraces the same tries; another CPU model may round differently, train other weights and
# need another number of tries.
MAX_TRIES = 8
TRY_SEED_STEP = 100


def seeded_specs(junior, senior, seed: int = SEED, attempt: int = 0) -> dict:
    """The junior's and the senior's :class:`~tandem_rlvr.world.sft.ModelSpec` for the build seed ``seed`` and
    its try ``attempt`` (0-based): seeds ``seed + 1`` and ``seed + 2``, ``TRY_SEED_STEP`` higher per try."""
    step = TRY_SEED_STEP * attempt
    return {"junior": replace(junior, seed=seed + 1 + step), "senior": replace(senior, seed=seed + 2 + step)}


def short_accuracy(model_measure: dict) -> float:
    """A model's mean greedy accuracy on 2- and 3-operation problems (its ``greedy_accuracy_by_length``, keys
    int or, read back from JSON, str)."""
    acc = model_measure["greedy_accuracy_by_length"]
    return sum(acc[n] if n in acc else acc[str(n)] for n in (2, 3)) / 2


def failed_checks(checks: list[tuple[str, bool, str]]) -> list[str]:
    """The readable line of every failed ``(model, ok, message)`` check of a property gate (empty: all hold)."""
    return [msg for _, ok, msg in checks if not ok]


def models_failing(checks: list[tuple[str, bool, str]]) -> list[str]:
    """The models (junior, then senior) with at least one failed check: the ones a build trains again."""
    failing = {who for who, ok, _ in checks if not ok}
    return [name for name in ("junior", "senior") if name in failing]


def measure_pair(paths, count: int, budget_facts, measure_model) -> dict:
    """A budget world's gate measurements: ``{"budget": budget_facts(tok, count), "junior": ..., "senior": ...}``,
    each model's from ``measure_model(model, tok, count, role)``, run single-threaded (so one machine measures the
    same numbers every time)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(paths.tokenizer_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {"budget": budget_facts(tok, count)}
        for role, d in (("junior", paths.junior_dir), ("senior", paths.senior_dir)):
            out[role] = measure_model(AutoModelForCausalLM.from_pretrained(str(d)).eval(), tok, count, role)
    finally:
        torch.set_num_threads(threads)
    return out


def tokenizer_texts(stream, solutions, seed: int) -> list[str]:
    """A world's tokenizer corpus: ``TOKENIZER_CORPUS`` problems from ``stream`` (``(n_ops, problem)`` pairs),
    each as its chat-framed user turn followed by ``solutions(problem)`` (a list of texts), shuffled by ``seed``."""
    import random

    corpus = []
    for _ in range(TOKENIZER_CORPUS):
        _, p = next(stream)
        corpus.append(f"<|im_start|>user\n{p.text}<|im_end|>\n<|im_start|>assistant\n")
        corpus += solutions(p)
    random.Random(seed).shuffle(corpus)
    return corpus


def budget_recipe(world, version: int, seed: int, specs: dict, formats: str, properties: dict, count: int,
                  styles: dict | None = None, **gate) -> dict:
    """A budget world's recipe (what determines its build; its hash names the cache folder): the world module's
    ``NAME``, ``BUDGET`` and ``SPLIT_SPECS``, the tokenizer, chat template and instruction every world shares,
    the models' ``specs``, the ``formats`` fingerprint, its ``styles`` (if any) and its property gate
    (``properties``, ``count``, the shared tries and seed step, and the probes' settings ``gate``)."""
    from tandem_rlvr.data import PROMPT_SUFFIX
    from tandem_rlvr.world.tokenizer import CHAT_TEMPLATE, DIGIT_PATTERN

    out = {
        "world": world.NAME, "version": version, "seed": seed, "budget": world.BUDGET,
        "tokenizer": {"vocab": TOKENIZER_VOCAB, "corpus": TOKENIZER_CORPUS, "pattern": DIGIT_PATTERN},
        "chat_template": CHAT_TEMPLATE, "instruction": PROMPT_SUFFIX,
        "junior": specs["junior"].to_dict(), "senior": specs["senior"].to_dict(),
        "formats": formats, "splits": world.SPLIT_SPECS,
        "gate": {"properties": properties, "count": count, "max_tries": MAX_TRIES, "seed_step": TRY_SEED_STEP,
                 **gate, "retrain": "each model whose properties fail"},
    }
    if styles is not None:
        out["styles"] = styles
    return out
