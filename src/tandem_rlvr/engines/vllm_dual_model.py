"""The vLLM side of the dual decoder: one model that holds both stacks, one logits processor that picks the author.

Loaded inside vLLM's worker (``vllm.general_plugins`` entry point :func:`register`, or a direct call in
the engine's own process); imports vLLM, so only :mod:`tandem_rlvr.engines.vllm_dual` touches it.

* :class:`TandemForCausalLM` is the senior's checkpoint under another architecture name (``hf_overrides``:
  ``architectures``, ``vocab_size`` = 2V + 1, ``tandem_vocab`` = V, ``tandem_junior`` = the junior's
  folder, ``tandem_senior_architectures``). It builds the senior and the junior as two vLLM sub-models,
  so vLLM allocates KV cache for both stacks' attention layers. Every token runs through both stacks
  (both read the whole shared text); every id is mapped into [0, V) before embedding (id - V for the
  junior's, the stop sentinel too). Its logits are
  ``[senior | junior | stop sentinel]``: width 2V + 1, a sampled id >= V meaning "the junior wrote
  id - V", so ownership is in the token stream itself. In solo mode (rollouts the junior never writes)
  the junior half is -inf, and an eager step runs the senior stack alone; a captured CUDA graph runs both
  stacks and reads the mode from a buffer (:meth:`TandemForCausalLM.forward`).
* :class:`TandemLogitsProcessor` (vLLM's V1 interface; the engine pins the V1 model runner) keeps one
  :class:`~tandem_rlvr.engines.handoff.SequenceSchedule` per request, built from the request's
  ``extra_args["tandem"]`` with the same seeded :class:`~tandem_rlvr.engines.handoff.CoinStream` as every
  other engine, feeds it the request's tokens and masks the half of the non-author before sampling
  (it is not argmax-invariant, so vLLM applies it before greedy argmax, temperature, top-k and top-p).
  A request past ``max_rounds`` may only sample the sentinel 2V, a stop token. The state is rebuilt from
  the request's tokens whenever vLLM (re)adds it, so a preempted and recomputed request replays the
  same coins.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

from tandem_rlvr.engines.vllm_dual import shared_ids

if TYPE_CHECKING:
    from tandem_rlvr.engines.handoff import SequenceSchedule

ARCH = "TandemForCausalLM"
__all__ = ["ARCH", "TandemForCausalLM", "TandemLogitsProcessor", "register", "REFUSED"]


def register() -> None:
    """Make :class:`TandemForCausalLM` known to vLLM (the ``vllm.general_plugins`` entry point calls this in every
    vLLM process; the engine also calls it in its own)."""
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "tandem_rlvr.engines.vllm_dual_model:TandemForCausalLM")


def _junior_weights(folder: str) -> Iterable[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    from tandem_rlvr.engines.weights import safetensors_files

    for f in safetensors_files(folder, "tandem junior"):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


def _traced() -> bool:
    """Whether this forward is being recorded (a CUDA graph capture, torch.compile, a trace) rather than run:
    a Python branch taken now would be frozen into every replay."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class TandemForCausalLM(nn.Module):
    """The senior's and the junior's decoder stacks side by side (see the module docstring)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from transformers import AutoConfig
        from vllm.compilation.backends import set_model_tag
        from vllm.model_executor.models.utils import init_vllm_registered_model, maybe_prefix

        hf = vllm_config.model_config.hf_config
        self.V = int(hf.tandem_vocab)
        self.junior_path = str(hf.tandem_junior)
        senior_cfg = copy.deepcopy(hf)
        senior_cfg.vocab_size = self.V
        trust = vllm_config.model_config.trust_remote_code is True  # the user's model.trust_remote_code
        junior_cfg = AutoConfig.from_pretrained(self.junior_path, trust_remote_code=trust)
        if int(junior_cfg.vocab_size) != self.V:
            raise ValueError(f"tandem: the junior {self.junior_path!r} has {junior_cfg.vocab_size} vocabulary rows, "
                             f"the senior {self.V}: one vocabulary is needed")
        self.senior = init_vllm_registered_model(vllm_config, prefix=maybe_prefix(prefix, "senior"), hf_config=senior_cfg,
                                                 architectures=list(hf.tandem_senior_architectures))
        with set_model_tag("tandem_junior"):  # its own compiled graph (layer names are baked into it)
            self.junior = init_vllm_registered_model(vllm_config, prefix=maybe_prefix(prefix, "junior"),
                                                     hf_config=junior_cfg, architectures=list(junior_cfg.architectures))
        self.widths = (int(senior_cfg.hidden_size), int(junior_cfg.hidden_size))
        self.init_solo()

    def init_solo(self) -> None:
        """Solo mode (rollouts the junior never writes) is off; it lives in a Python flag (eager steps, logits)
        and in a buffer the forward reads (a captured graph), both set by :meth:`set_solo`."""
        self.solo = False
        self.register_buffer("solo_flag", torch.zeros((), dtype=torch.bool), persistent=False)

    def set_solo(self, solo: bool) -> None:
        """Solo mode on or off: the flag, and the buffer in place (a captured graph reads its memory)."""
        self.solo = bool(solo)
        self.solo_flag.fill_(self.solo)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.senior.embed_input_ids(shared_ids(input_ids, self.V))

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Both stacks' last hidden states side by side. Solo mode: in an eager step the junior is skipped; a
        traced or captured forward (vLLM's CUDA graphs, captured lazily in either mode) runs both stacks and
        reads the solo buffer, so one graph serves both modes and never freezes the mode it was captured in."""
        if input_ids is None or inputs_embeds is not None or intermediate_tensors is not None:
            raise ValueError("the tandem model decodes token ids only (no prompt embeddings, no pipeline parallelism)")
        ids = shared_ids(input_ids, self.V)
        h_s = self.senior(ids, positions)
        if self.solo and not _traced():
            return torch.cat([h_s, h_s.new_zeros(*h_s.shape[:-1], self.widths[1])], -1)
        h_j = self.junior(ids, positions)
        return torch.cat([h_s, torch.where(self.solo_flag, torch.zeros_like(h_j), h_j)], -1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h_s, h_j = hidden_states.split(self.widths, dim=-1)
        senior = self.senior.compute_logits(h_s)[..., : self.V]
        if self.solo:
            junior = torch.full_like(senior, float("-inf"))
        else:
            junior = self.junior.compute_logits(h_j)[..., : self.V]
        return torch.cat([senior, junior, senior.new_full((*senior.shape[:-1], 1), float("-inf"))], -1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The checkpoint stream (the senior's folder) goes to the senior; the junior reads its own folder."""
        loaded = {f"senior.{n}" for n in self.senior.load_weights(weights)}
        return loaded | {f"junior.{n}" for n in self.junior.load_weights(_junior_weights(self.junior_path))}


# -- the author ------------------------------------------------------------------------------------------
REFUSED = {  # sampling features whose meaning breaks over the 2V + 1 wide row
    "logprobs": "log-probs would mix both models' logits",
    "prompt_logprobs": "log-probs would mix both models' logits",
    "presence_penalty": "a junior token (id + V) is another token than the same senior token",
    "frequency_penalty": "a junior token (id + V) is another token than the same senior token",
    "repetition_penalty": "a junior token (id + V) is another token than the same senior token",
    "logit_bias": "ids are doubled",
    "allowed_token_ids": "ids are doubled",
    "bad_words": "ids are doubled",
    "structured_outputs": "a grammar knows one vocabulary",
}
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def _row_state(args: dict, tables: dict, coins: dict):
    """A fresh :class:`SequenceSchedule` for one request (schedules and coin streams shared across requests)."""
    from tandem_rlvr.engines.handoff import Schedule, SequenceSchedule

    schedule = Schedule.from_dict(args, tables.get("table"))  # the engine's Schedule.to_dict() (and n, b, seed)
    schedule = tables.setdefault(tuple(schedule.to_dict().items()), schedule)
    ckey = (args["n"], schedule.p, args["seed"])
    if ckey not in coins:
        coins[ckey] = schedule.coins(args["n"], args["seed"])
    return SequenceSchedule(schedule, coins[ckey], args["b"])


@dataclass
class _Row:
    """One tandem request in the running batch: its ``extra_args['tandem']``, vLLM's live list of its output
    ids, its schedule and how many of those ids the schedule has been fed."""

    args: dict
    out: list
    sched: SequenceSchedule
    fed: int = 0


class TandemLogitsProcessor(V1LogitsProcessor):
    """Masks the non-author's half of each tandem request's logits (see the module docstring)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        hf = vllm_config.model_config.hf_config
        self.V = int(getattr(hf, "tandem_vocab", 0) or 0)
        self.tables: dict = {}
        self.coins: dict = {}
        self.rows: dict[int, _Row] = {}  # batch index -> its request
        if self.V:
            from transformers import AutoTokenizer

            from tandem_rlvr.engines.handoff import token_table

            tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
            self.tables["table"] = token_table(tok, self.V)

    @classmethod
    def validate_params(cls, params) -> None:
        """Every request names its schedule; features that the doubled vocabulary breaks are refused."""
        if not (params.extra_args or {}).get("tandem"):
            raise ValueError("a tandem engine request needs extra_args['tandem'] (tandem_rlvr.engines.vllm_dual)")
        for name, why in REFUSED.items():
            value = getattr(params, name, None)
            if value is not None and value != _NEUTRAL.get(name, None) and value not in ({}, [], 0):
                raise ValueError(f"the tandem vLLM engine refuses {name} ({why})")

    def is_argmax_invariant(self) -> bool:
        return False  # it decides who may write: vLLM must apply it before greedy argmax

    def update_state(self, batch_update) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output_ids in batch_update.added:
                args = params.extra_args["tandem"]
                self.rows[index] = _Row(args, output_ids, _row_state(args, self.tables, self.coins))
            for a, b, kind in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and kind.name == "SWAP":
                    self.rows[a] = rb
        if not self.rows:
            self.coins.clear()

    def _catch_up(self, row: _Row) -> None:
        """Feed the schedule the request's new tokens, up to the first placeholder (``-1``: a token vLLM has not
        copied to the host yet; the engine turns async scheduling off, this keeps a placeholder from ever
        being read as a token)."""
        fed = row.fed
        for tok in row.out[fed:]:
            if tok < 0:
                break
            if tok != 2 * self.V:
                row.sched.feed(tok - self.V if tok >= self.V else tok)
            fed += 1
        row.fed = fed

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        senior, junior, stop = [], [], []
        for index, row in self.rows.items():
            self._catch_up(row)
            sched = row.sched
            (stop if sched.over(row.args["max_rounds"]) else senior if sched.author else junior).append(index)
        V, neg = self.V, float("-inf")
        if senior:
            logits[senior, V:] = neg
        if junior:
            logits[junior, :V] = neg
            logits[junior, 2 * V:] = neg
        if stop:
            logits[stop, :] = neg
            logits[stop, 2 * V] = 0.0
        return logits
