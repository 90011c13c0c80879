"""How a problem becomes the prompt's chat messages: the prompt template, the system prompt, a prompt column
of chat messages, and ``chat_template_kwargs`` (the ``data.*`` keys of docs/rewards-and-data.md).

With none of them set a problem stays a plain ``str`` and :func:`tandem_rlvr.data.render_prompt` renders the
paper's prompt (the problem + :data:`PROMPT_SUFFIX`, one user turn). With any of them set the loader turns
each problem into a :class:`ChatProblem`: a ``str`` (the problem text, as before, for ids, logs and
equality) that also carries the messages to render and the keyword arguments of
``tokenizer.apply_chat_template``. Every renderer receives ``Example.problem`` (training, validation, the
text bridge, the evaluation), so all of them render the same prompt without passing the format around.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PROMPT_SUFFIX", "ChatProblem", "PromptFormat", "chat_messages", "messages_from_cell", "template_problem"]

PROMPT_SUFFIX = (
    " Solve the following math problem step by step. Put your final answer inside \\boxed{}, "
    "like \\boxed{42} or \\boxed{\\frac{1}{2}}."
)


@dataclass(frozen=True)
class PromptFormat:
    """``template``: the user turn with every ``{problem}`` replaced by the problem (other braces kept as
    written); empty = the problem + :data:`PROMPT_SUFFIX`. ``system``: a system message first (empty = none).
    ``chat_template_kwargs``: extra keyword arguments of ``tokenizer.apply_chat_template`` as sorted items."""

    template: str = ""
    system: str = ""
    chat_template_kwargs: tuple = ()

    @classmethod
    def of(cls, template: str = "", system: str = "", chat_template_kwargs: Mapping | None = None) -> PromptFormat:
        return cls(template or "", system or "", tuple(sorted(dict(chat_template_kwargs or {}).items())))

    @property
    def is_default(self) -> bool:
        return not (self.template or self.system or self.chat_template_kwargs)

    def user_turn(self, problem: str) -> str:
        return self.template.replace("{problem}", problem) if self.template else problem + PROMPT_SUFFIX

    def problem(self, text: str) -> str:
        """``text`` as the loader keeps it: unchanged under the default format, else a :class:`ChatProblem`."""
        if self.is_default:
            return text
        return ChatProblem(text, self._with_system([{"role": "user", "content": self.user_turn(text)}]),
                           self.chat_template_kwargs)

    def _with_system(self, messages: list[dict]) -> tuple:
        if self.system and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system}, *messages]
        return tuple(messages)


class ChatProblem(str):
    """A problem's text (the ``str`` itself) with the chat ``messages`` its prompt is rendered from and the
    ``chat_template_kwargs`` items passed to ``apply_chat_template``. Pickles as itself (spawned processes)."""

    messages: tuple
    chat_template_kwargs: tuple

    def __new__(cls, text: str, messages: Sequence[Mapping[str, str]], chat_template_kwargs: tuple = ()):
        self = super().__new__(cls, text)
        self.messages = tuple({"role": m["role"], "content": m["content"]} for m in messages)
        self.chat_template_kwargs = tuple(chat_template_kwargs)
        return self

    def __reduce__(self):
        return (type(self), (str(self), self.messages, self.chat_template_kwargs))


def chat_messages(problem: ChatProblem) -> list[dict]:
    """A fresh copy of the messages (``apply_chat_template`` may not change ours)."""
    return [dict(m) for m in problem.messages]


def plain_turn(problem: ChatProblem) -> str:
    """The text a tokenizer without a chat template reads: every message's content, in order, one blank line apart."""
    return "\n\n".join(m["content"] for m in problem.messages)


def messages_from_cell(cell: Any, fmt: PromptFormat) -> tuple[ChatProblem | None, str]:
    """A prompt column's cell as ``(ChatProblem, "")``, or ``(None, why)`` for a row to skip.

    The cell is a list of ``{role, content}`` (string role and content, at least one user turn), used as
    written (the system prompt is prepended when it has no system turn; no template, no suffix), also as
    JSON text (a CSV cell); or other text, which is one user turn as written. The problem text is the last
    user turn's content."""
    if isinstance(cell, str):
        cell = _json_messages(cell) or [{"role": "user", "content": cell}]
    if cell is None:
        return None, "missing prompt"
    if not isinstance(cell, Sequence) or not cell:
        return None, "prompt not a list of messages"
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
               for m in cell):
        return None, "prompt message without a string role and content"
    users = [m["content"] for m in cell if m["role"] == "user"]
    if not users or not users[-1].strip():
        return None, "prompt without a user turn"
    return ChatProblem(users[-1], fmt._with_system([dict(m) for m in cell]), fmt.chat_template_kwargs), ""


def _json_messages(text: str) -> list | None:
    """``text`` as a JSON list of objects (chat messages written into a CSV cell), else None."""
    import json

    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) and value and all(isinstance(m, dict) for m in value) else None


def template_problem(template: str) -> str | None:
    """Why ``template`` cannot be a prompt template (None: it can): it must contain ``{problem}``."""
    if template and "{problem}" not in template:
        return f"must contain {{problem}} (where the problem goes), got {template!r}"
    return None
