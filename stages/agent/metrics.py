"""The agent loop's metrics of one rollout (pure; the rollout stage adds them to the step's).

Counts are per rollout batch; means state their denominator:

==================================  ==========================================================
agent/rounds                        generation rounds (engine calls) the batch took
agent/stop/{reason}                 fraction of trajectories that ended for that reason
                                    (``stages.agent.loop.STOP_REASONS``); denominator: rows
agent/tool_calls                    tool calls that ran (dropped ones excluded)
agent/dropped_calls                 calls past ``max_parallel_calls`` (not run)
agent/malformed_calls               tool-call blocks the parser could not read
agent/tool_seconds/{mean,max}       wall time of one call in its process; denominator: calls
agent/tool_response_tokens/mean     tool-turn ids (response_mask 0) per trajectory; denominator:
                                    rows
agent/tool/{name}/calls             calls of that tool
agent/tool/{name}/errors            its calls whose result was not ``ok`` (errors, timeouts,
                                    invalid results, unknown tool, bad arguments)
agent/tool/{name}/timeouts          its calls killed at ``multi_turn.sandbox.timeout_s``
==================================  ==========================================================

``num_turns/*`` and ``tool_call_counts/*`` come from the batch's columns (the data metrics).

Example:
    >>> from stages.agent.loop import Trajectory
    >>> t = Trajectory(prompt_ids=[1], uses_tools=True, stop_reason="no_tool_call")
    >>> agent_metrics([t])["agent/stop/no_tool_call"]
    1.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from stages.agent.loop import STOP_REASONS, Trajectory


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The metrics of the module docstring for one batch of finished trajectories."""
    rows = max(len(trajectories), 1)
    stops = Counter(t.stop_reason for t in trajectories)
    results = [
        result
        for t in trajectories
        for turn in t.turns
        if turn.role == "tool"
        for result in turn.results
    ]
    seconds = [float(r["seconds"]) for r in results]
    tool_ids = sum(t.response_mask.count(0) for t in trajectories)
    metrics = {
        "agent/rounds": float(max((t.assistant_turns for t in trajectories), default=0)),
        **{f"agent/stop/{reason}": stops[reason] / rows for reason in STOP_REASONS},
        "agent/tool_calls": float(len(results)),
        "agent/dropped_calls": float(sum(t.dropped_calls for t in trajectories)),
        "agent/malformed_calls": float(sum(t.malformed_calls for t in trajectories)),
        "agent/tool_response_tokens/mean": tool_ids / rows,
    }
    if seconds:
        metrics["agent/tool_seconds/mean"] = sum(seconds) / len(seconds)
        metrics["agent/tool_seconds/max"] = max(seconds)
    for name in sorted({r["name"] for r in results}):
        mine = [r for r in results if r["name"] == name]
        metrics[f"agent/tool/{name}/calls"] = float(len(mine))
        metrics[f"agent/tool/{name}/errors"] = float(sum(r["status"] != "ok" for r in mine))
        metrics[f"agent/tool/{name}/timeouts"] = float(sum(r["status"] == "timeout" for r in mine))
    return metrics
