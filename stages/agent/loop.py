"""The agent loop over token ids: assistant turns (generated) alternating with tool turns.

Every trajectory is one growing list of token ids. ``response_ids`` holds everything after the
prompt; ``response_mask`` is 1 on the ids the model sampled and 0 on the ids a tool turn appended;
``log_probs`` are the sampled ids' log-probs and 0.0 elsewhere. Sampled ids are appended as they
came out of the engine, never decoded and re-encoded, so the actor's recomputed log-probs on the
trajectory are the rollout's up to float rounding.

One round serves every live trajectory at once (verl's ToolAgentLoop, ``tool_agent_loop.py``, run
as a batch):

1. **generate**: one engine call for the live trajectories, each continuing from its own ids,
   with at most ``response_length - len(response_ids)`` new ids (the rest of the budget; the call
   asks for the largest row's budget and each row is cut to its own). ``assistant_turns += 1``.
2. **stop checks**, in verl's order: the response is full (``length``), ``max_assistant_turns``
   reached, ``max_user_turns`` reached; then the turn is parsed (``multi_turn.format``) and a
   turn with no call ends the trajectory (``no_tool_call``). A loop whose agent does not use
   tools ends after its first turn (``single_turn``).
3. **tools**: the first ``max_parallel_calls`` calls of each turn run (all turns' calls in one
   batch, on the sandbox's processes); later calls are dropped and counted (verl drops them
   silently). Each result becomes one ``{"role": "tool", "content": text}`` message, truncated to
   ``max_tool_response_length`` characters (:func:`truncate_tool_text`). The messages' ids (the
   chat template's delta, ``stages.agent.chat_delta``) are appended with mask 0 unless they would
   make the response reach ``response_length``: then the trajectory ends without them
   (``tool_response_too_long``, verl's rule). ``user_turns += 1``.

A finished trajectory has ``num_turns = user_turns + assistant_turns + 1`` (verl's count, the
prompt being a turn). Tool rewards (a tool's non-None reward; 0.0 for a call that failed, as verl
returns) are kept per trajectory in ``tool_rewards``; nothing adds them to the reward — a scorer
may read them (verl's semantics).

The loop is a pure function of its inputs and the callables it is given; the engine, the tool
sandbox, the parser and the tokenizer are at the edges (``stages.agent.rollout``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: stop reasons of a trajectory (``agent/stop/<reason>`` metrics count them)
STOP_REASONS = (
    "length",
    "max_assistant_turns",
    "max_user_turns",
    "no_tool_call",
    "single_turn",
    "tool_response_too_long",
    "interaction_done",
    "interaction_error",
    "user_turn_too_long",
)
TRUNCATED = "(truncated)"


@dataclass(frozen=True)
class GeneratedTurn:
    """One trajectory's new ids from one engine call.

    ids: the sampled ids, up to and including the end-of-turn token when there was one.
    log_probs: one per id.
    ended_with_eos: the turn ended at the tokenizer's EOS (not at the token budget).
    """

    ids: list[int]
    log_probs: list[float]
    ended_with_eos: bool


#: generate(contexts: each trajectory's ids so far, max_new_tokens) -> one GeneratedTurn per context
GenerateFn = Callable[[list[list[int]], int], list[GeneratedTurn]]
#: parse(turn ids) -> ParsedTurn (``stages.agent.parsers``: content, calls, malformed)
ParseFn = Callable[[list[int]], Any]
#: run_tools(ToolCall list) -> ToolResult list, same order (``stages.agent.sandbox``)
RunToolsFn = Callable[[list[Any]], list[Any]]
#: tool_turn_ids(tool messages, the turn ended with EOS) -> ids to append (``stages.agent.chat_delta``)
ToolTurnIdsFn = Callable[[list[dict[str, Any]], bool], list[int]]
#: make_call(name, arguments JSON text, the row's tools_kwargs) -> a sandbox ToolCall
MakeCallFn = Callable[[str, str, dict[str, Any]], Any]
#: interact([(interaction name, its kwargs, messages so far)]) -> InteractionReply list
InteractFn = Callable[[list[tuple[str, dict[str, Any], list[dict[str, Any]]]]], list[Any]]
#: user_turn_ids(user messages, the turn ended with EOS) -> ids to append (``chat_delta``)
UserTurnIdsFn = Callable[[list[dict[str, Any]], bool], list[int]]
#: decode(assistant turn ids) -> its text, special tokens skipped (the interaction's messages)
DecodeFn = Callable[[list[int]], str]


@dataclass(frozen=True)
class LoopLimits:
    """The loop's limits (``actor_rollout_ref.rollout.*`` / ``…multi_turn.*``).

    response_length: R, the most response ids (model and tool ids together).
    max_assistant_turns / max_user_turns: None = no limit.
    max_parallel_calls: calls of one turn that run.
    max_tool_response_length: characters of one tool result kept.
    truncate_side: ``left`` keeps the last characters, ``right`` the first, ``middle`` both ends.
    """

    response_length: int
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    truncate_side: str = "middle"


@dataclass
class TurnRecord:
    """One turn of a trajectory, for ``ppoflow inspect`` and the trajectory tables.

    role: ``assistant`` or ``tool``; start / end: its ids' span in ``response_ids``.
    calls: (assistant) the parsed calls ``{"name", "arguments"}``, dropped ones included with
        ``"dropped": True``; malformed: blocks the parser could not read.
    results: (tool) per call ``{"name", "status", "reward", "seconds", "text"}``.
    seconds: wall time of the turn (generation call or tool batch).
    """

    role: str
    start: int
    end: int
    seconds: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)

    def to_plain(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "start": self.start,
            "end": self.end,
            "seconds": round(self.seconds, 6),
            "calls": self.calls,
            "malformed": self.malformed,
            "results": self.results,
        }


@dataclass
class Trajectory:
    """One sample's multi-turn trajectory (module docstring for the fields' meaning)."""

    prompt_ids: list[int]
    uses_tools: bool
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    stop_reason: str = ""
    turns: list[TurnRecord] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    dropped_calls: int = 0
    malformed_calls: int = 0
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    last_turn_ended_with_eos: bool = False
    interaction: str | None = None  # the row's interaction (extra_info.interaction_kwargs.name)
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)  # kept with an interaction
    turn_scores: list[float] = field(default_factory=list)
    pending_interaction: bool = False

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    @property
    def num_turns(self) -> int:
        """verl's count: user turns + assistant turns + 1."""
        return self.user_turns + self.assistant_turns + 1

    @property
    def ids(self) -> list[int]:
        """Prompt ‖ response ids: what the next turn continues from."""
        return self.prompt_ids + self.response_ids


def truncate_tool_text(text: str, limit: int, side: str) -> str:
    """verl's truncation of one tool result to ``limit`` characters (plus the marker).

    Example:
        >>> truncate_tool_text("abcdefgh", 4, "left")
        '(truncated)...efgh'
        >>> truncate_tool_text("abcdefgh", 4, "right")
        'abcd...(truncated)'
        >>> truncate_tool_text("abcdefgh", 4, "middle")
        'ab...(truncated)...gh'
        >>> truncate_tool_text("abc", 4, "middle")
        'abc'
    """
    if len(text) <= limit:
        return text
    if side == "left":
        return f"{TRUNCATED}..." + text[-limit:]
    if side == "right":
        return text[:limit] + f"...{TRUNCATED}"
    half = limit // 2
    return text[:half] + f"...{TRUNCATED}..." + (text[-half:] if half else "")


def run_agent_loop(
    trajectories: Sequence[Trajectory],
    limits: LoopLimits,
    *,
    generate: GenerateFn,
    parse: ParseFn | None = None,
    run_tools: RunToolsFn | None = None,
    tool_turn_ids: ToolTurnIdsFn | None = None,
    make_call: MakeCallFn | None = None,
    on_finished: Callable[[list[int]], None] | None = None,
    interact: InteractFn | None = None,
    user_turn_ids: UserTurnIdsFn | None = None,
    decode: DecodeFn | None = None,
) -> list[Trajectory]:
    """Run every trajectory to its end (module docstring); returns them, filled in.

    ``parse`` / ``run_tools`` / ``tool_turn_ids`` / ``make_call`` are needed only when some
    trajectory ``uses_tools``. ``on_finished(indices)`` is called after each round with the
    indices (into ``trajectories``) of those that finished in it, before the next round
    generates: the rollout scores them meanwhile (``stages.agent.scoring``).
    """
    live = [i for i, t in enumerate(trajectories) if not t.done]
    if any(trajectories[i].uses_tools for i in live) and None in (
        parse,
        run_tools,
        tool_turn_ids,
        make_call,
    ):
        raise ValueError("a tool-using agent loop needs parse, run_tools, tool_turn_ids, make_call")
    if any(trajectories[i].interaction for i in live) and None in (interact, user_turn_ids, decode):
        raise ValueError("an agent loop with interactions needs interact, user_turn_ids, decode")
    while live:
        _generation_round([trajectories[i] for i in live], limits, generate, parse, decode)
        calling = [trajectories[i] for i in live if trajectories[i].pending_calls]
        if calling:
            _tool_round(calling, limits, run_tools, tool_turn_ids, make_call)
        asked = [trajectories[i] for i in live if trajectories[i].pending_interaction]
        if asked:
            _interaction_round(asked, limits, interact, user_turn_ids)
        finished = [i for i in live if trajectories[i].done]
        live = [i for i in live if not trajectories[i].done]
        if finished and on_finished is not None:
            on_finished(finished)
    return list(trajectories)


def _generation_round(
    live: list[Trajectory],
    limits: LoopLimits,
    generate: GenerateFn,
    parse: ParseFn | None,
    decode: DecodeFn | None = None,
) -> None:
    budgets = [limits.response_length - len(t.response_ids) for t in live]
    started = time.perf_counter()
    outputs = generate([t.ids for t in live], max(budgets))
    seconds = time.perf_counter() - started
    if len(outputs) != len(live):
        raise ValueError(f"generate returned {len(outputs)} turns for {len(live)} trajectories")
    for trajectory, out, budget in zip(live, outputs, budgets, strict=True):
        ids, log_probs = list(out.ids[:budget]), [float(x) for x in out.log_probs[:budget]]
        start = len(trajectory.response_ids)
        trajectory.response_ids += ids
        trajectory.response_mask += [1] * len(ids)
        trajectory.log_probs += log_probs
        trajectory.assistant_turns += 1
        trajectory.last_turn_ended_with_eos = out.ended_with_eos and len(out.ids) <= budget
        record = TurnRecord("assistant", start, len(trajectory.response_ids), seconds)
        trajectory.turns.append(record)
        if trajectory.interaction:
            trajectory.messages.append({"role": "assistant", "content": decode(ids)})
        trajectory.stop_reason = _stop_reason(trajectory, limits)
        if trajectory.done:
            continue
        if not trajectory.uses_tools:
            trajectory.stop_reason = "single_turn"
            continue
        parsed = parse(ids)
        record.malformed = int(parsed.malformed)
        trajectory.malformed_calls += record.malformed
        calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
        kept = calls[: limits.max_parallel_calls]
        record.calls = kept + [{**c, "dropped": True} for c in calls[len(kept) :]]
        trajectory.dropped_calls += len(calls) - len(kept)
        if not kept and trajectory.interaction:
            trajectory.pending_interaction = True  # the interaction answers this turn
        elif not kept:
            trajectory.stop_reason = "no_tool_call"
        trajectory.pending_calls = kept


def _stop_reason(trajectory: Trajectory, limits: LoopLimits) -> str:
    """verl's checks after a generation, in its order ('' = go on)."""
    if len(trajectory.response_mask) >= limits.response_length:
        return "length"
    if limits.max_assistant_turns and trajectory.assistant_turns >= limits.max_assistant_turns:
        return "max_assistant_turns"
    if limits.max_user_turns and trajectory.user_turns >= limits.max_user_turns:
        return "max_user_turns"
    return ""


def _tool_round(
    calling: list[Trajectory],
    limits: LoopLimits,
    run_tools: RunToolsFn,
    tool_turn_ids: ToolTurnIdsFn,
    make_call: MakeCallFn,
) -> None:
    requests = [
        make_call(c["name"], c["arguments"], t.tools_kwargs)
        for t in calling
        for c in t.pending_calls
    ]
    started = time.perf_counter()
    results = iter(run_tools(requests))
    seconds = time.perf_counter() - started
    for trajectory in calling:
        messages, record = [], TurnRecord("tool", len(trajectory.response_ids), 0, seconds)
        for call in trajectory.pending_calls:
            result = next(results)
            text = truncate_tool_text(
                result.text, limits.max_tool_response_length, limits.truncate_side
            )
            reward = result.reward if result.status == "ok" else 0.0
            if reward is not None:
                trajectory.tool_rewards.append(float(reward))
            record.results.append(
                {
                    "name": call["name"],
                    "status": result.status,
                    "reward": reward,
                    "seconds": round(float(result.seconds), 6),
                    "text": text,
                }
            )
            messages.append({"role": "tool", "content": text})
        trajectory.pending_calls = []
        if trajectory.interaction:
            trajectory.messages.extend(messages)
        ids = tool_turn_ids(messages, trajectory.last_turn_ended_with_eos)
        trajectory.turns.append(record)
        if not _append_context_turn(trajectory, ids, record, limits):
            trajectory.stop_reason = "tool_response_too_long"


def _append_context_turn(
    trajectory: Trajectory, ids: list[int], record: TurnRecord, limits: LoopLimits
) -> bool:
    """Append a tool or user turn's ``ids`` (mask 0, log-prob 0) and count it, unless they would
    make the response reach ``response_length`` (verl's rule): then nothing is appended and the
    answer is False. ``record.end`` marks what was appended."""
    record.end = record.start
    if len(trajectory.response_mask) + len(ids) >= limits.response_length:
        return False
    trajectory.response_ids += ids
    trajectory.response_mask += [0] * len(ids)
    trajectory.log_probs += [0.0] * len(ids)
    trajectory.user_turns += 1
    record.end = len(trajectory.response_ids)
    return True


def _interaction_round(
    asked: list[Trajectory],
    limits: LoopLimits,
    interact: InteractFn,
    user_turn_ids: UserTurnIdsFn,
) -> None:
    """Each asked trajectory's interaction answers its last assistant turn (one batch): the
    answer is appended as a user turn (mask 0) when it fits, its score kept; the trajectory ends
    when the interaction says so, or its answer failed or did not fit."""
    started = time.perf_counter()
    replies = interact([(t.interaction, t.interaction_kwargs, list(t.messages)) for t in asked])
    seconds = time.perf_counter() - started
    for trajectory, reply in zip(asked, replies, strict=True):
        trajectory.pending_interaction = False
        start = len(trajectory.response_ids)
        record = TurnRecord("user", start, start, seconds)
        record.results.append(
            {
                "name": trajectory.interaction,
                "status": reply.status,
                "reward": reply.score,
                "seconds": round(seconds, 6),
                "text": reply.text,
                "terminate": reply.terminate,
            }
        )
        trajectory.turns.append(record)
        if reply.status != "ok":
            trajectory.stop_reason = "interaction_error"
            continue
        if reply.score is not None:
            trajectory.turn_scores.append(float(reply.score))
        message = {"role": "user", "content": reply.text}
        trajectory.messages.append(message)
        ids = user_turn_ids([message], trajectory.last_turn_ended_with_eos)
        if not _append_context_turn(trajectory, ids, record, limits):
            trajectory.stop_reason = "user_turn_too_long"
        elif reply.terminate:
            trajectory.stop_reason = "interaction_done"
