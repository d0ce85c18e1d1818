"""Interactions (user simulators / environments): the turn after an assistant turn with no tool call.

verl's ``BaseInteraction`` (verl before 0.9.1, ``verl/interactions/base.py``; 0.9.1 dropped it)
with its config file, ``multi_turn.interaction_config_path``::

    interaction:
      - name: "gsm8k"
        class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
        config: {}

A row takes part when its ``extra_info.interaction_kwargs`` names one (``name``; the rest are the
interaction's keyword arguments, e.g. ``ground_truth``). After each assistant turn that makes no
tool call, the interaction answers with ``generate_response(instance_id, messages, **kwargs) ->
(should_terminate, content, score, extra)``: ``content`` is appended as a user turn (mask 0; as
verl, also on the last turn), ``score`` joins the trajectory's ``turn_scores``, and the trajectory
ends when ``should_terminate``. ``messages`` is the conversation so far: the row's prompt messages,
each assistant turn decoded (special tokens skipped), the tool and user messages.

**Each answer runs in the tool sandbox** (its own process, time / memory / output limits, no
network): :class:`InteractionAsTool` adapts an interaction to the tool interface, so a turn is
``start_interaction`` → ``generate_response`` → ``finalize_interaction`` in a fresh process.
State an interaction keeps across turns must therefore come from ``messages`` and its kwargs (as
verl's gsm8k interaction's does); a hang, crash or bad answer ends the trajectory
(``interaction_error``) instead of the run. verl names ppoflow provides map to ppoflow's own
classes (:data:`VERL_INTERACTION_CLASSES`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stages.agent.tool_api import BaseTool, ToolResponse
from stages.agent.tool_config import ToolSpec, resolve_tool_class

#: verl's interaction classes that ppoflow implements itself
VERL_INTERACTION_CLASSES = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": (
        "stages.agent.interactions.Gsm8kInteraction"
    ),
}
ADAPTER = "stages.agent.interactions.InteractionAsTool"
PREFIX = "interaction:"  # a sandbox tool name of an interaction: "interaction:<name>"


class BaseInteraction:
    """verl's interaction interface (sync or ``async`` methods)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or "interaction"

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate, content, score, extra); subclasses implement it, this base
        answers as verl's does (go on, "Your current result seems acceptable.", 0.8)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """verl's gsm8k interaction: the last assistant message is scored against ``ground_truth``
    (strict ``#### answer`` format, 1.0 / 0.0); correct ends the trajectory with "Your response
    is correct!", else the model is asked to try again (score 0.0)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.truths: dict[str, Any] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any
    ) -> str:
        instance_id = instance_id or "gsm8k"
        self.truths[instance_id] = ground_truth
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        from stages.reward.scorers import gsm8k

        answer = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"),
            "",
        )
        truth = self.truths[instance_id]
        score = float(gsm8k.compute_score(answer, truth, method="strict", format_score=0.0))
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        text = "Your response is incorrect! You need to reflect on your answer and try again."
        return False, text, score, {}

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self.truths.pop(instance_id, None)


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class InteractionAsTool(BaseTool):
    """One interaction turn as a tool call, for the sandbox (module docstring).

    Config: ``class_name`` (the interaction's), ``config`` (its config). ``create`` builds the
    interaction and starts it with the row's kwargs; ``execute(id, {"messages": [...]})``
    answers with its response text, score and ``{"terminate": bool}``; ``release`` finalizes.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        interaction = resolve_tool_class(
            config["class_name"], VERL_INTERACTION_CLASSES, "interaction"
        )
        self.interaction = interaction(dict(config.get("config") or {}))
        self.kwargs: dict[str, Any] = {}

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        self.kwargs = dict(kwargs.get("create_kwargs") or {})
        started = await _settle(self.interaction.start_interaction(instance_id, **self.kwargs))
        return str(started), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float | None, dict[str, Any]]:
        reply = await _settle(
            self.interaction.generate_response(instance_id, parameters["messages"], **self.kwargs)
        )
        if not (isinstance(reply, tuple | list) and len(reply) == 4):
            raise TypeError(
                "generate_response must return (should_terminate, content, score, extra), got "
                f"{type(reply).__name__}"
            )
        terminate, content, score, _ = reply
        if not isinstance(content, str):
            raise TypeError(
                f"generate_response's content must be a str, got {type(content).__name__}"
            )
        return ToolResponse(text=content), score, {"terminate": bool(terminate)}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        await _settle(self.interaction.finalize_interaction(instance_id))


@dataclass(frozen=True)
class InteractionReply:
    """One interaction turn's answer: the user message, its score, whether it ends the
    trajectory, and the sandbox status (``ok`` or why not)."""

    text: str
    score: float | None
    terminate: bool
    status: str


def load_interaction_config(path: str | Path) -> tuple[ToolSpec, ...]:
    """verl's interaction config as sandbox specs (``interaction:<name>`` → the adapter).

    Raises:
        ValueError: one line naming the file and what is wrong (no ``interaction:`` list, an
            item without ``name`` / ``class_name``, a repeated name).
    """
    import yaml

    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"interaction config {where!r} does not exist") from None
    items = data.get("interaction") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(
            f"{where}: expected a top-level 'interaction:' list of {{name, class_name, config}}"
        )
    specs, seen = [], set()
    for i, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("name"), str)
            or not isinstance(item.get("class_name"), str)
        ):
            raise ValueError(f"{where}: interaction[{i}] needs a str 'name' and 'class_name'")
        if item["name"] in seen:
            raise ValueError(f"{where}: interaction[{i}]: name {item['name']!r} is used twice")
        seen.add(item["name"])
        config = {"class_name": item["class_name"], "config": dict(item.get("config") or {})}
        name = PREFIX + item["name"]
        schema = {"type": "function", "function": {"name": name}}
        origin = f"{where}: interaction[{i}]"
        specs.append(ToolSpec(name, ADAPTER, config, schema, origin))
    return tuple(specs)
