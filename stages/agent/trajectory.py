"""Finished agent-loop trajectories as the rollout's batch (verl's agent-loop output layout).

Tensors (B rows, prompt width P, response width R = ``response_length``):

    prompts            (B, P) the step input's prompt ids, left-padded (unchanged)
    responses          (B, R) every id after the prompt — assistant and tool turns — right-padded
    response_mask      (B, R) int64: 1 on the ids the model sampled, 0 on tool-turn ids and pad
    rollout_log_probs  (B, R) float32: the sampled ids' log-probs, 0.0 on tool ids and pad
    attention_mask     (B, T) prompt mask ‖ 1 on every response id (model and tool), 0 on pad
    input_ids          (B, T) prompts ‖ responses
    position_ids       (B, T) prompt positions, then the last prompt position + 1, + 2, …

so the actor's forward sees the whole conversation (tool ids attended to) while the losses, the
KL, the advantages and the entropy read only ``response_mask``: the model's own ids.

Non-tensor columns (B,):

    __num_turns__      int32: user turns + assistant turns + 1 (verl's count)
    tool_call_counts   int64: tool calls that ran (dropped ones excluded)
    tool_rewards       list[float]: each call's reward (verl's extra field; not added to the reward)
    agent_turns        list[dict]: the turns (role, span in ``responses``, calls, results, time)
    agent_stop_reason  str: why the trajectory ended (``stages.agent.loop.STOP_REASONS``)
    turn_scores        list[float]: the interaction's score of each of its turns (verl's field)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.loop import Trajectory

TOOL_REWARDS = "tool_rewards"
TURN_SCORES = "turn_scores"
AGENT_TURNS = "agent_turns"
AGENT_STOP_REASON = "agent_stop_reason"
#: the non-tensor columns an agent rollout adds (module docstring)
AGENT_COLUMNS = (
    K.NUM_TURNS,
    K.TOOL_CALL_COUNTS,
    TOOL_REWARDS,
    AGENT_TURNS,
    AGENT_STOP_REASON,
    TURN_SCORES,
)


def _padded(rows: Sequence[Sequence], width: int, fill, dtype: torch.dtype) -> Tensor:
    """(len(rows), width) right-padded with ``fill``."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def trajectories_to_batch(
    prompts: TensorDict, trajectories: Sequence[Trajectory], response_length: int, pad_id: int
) -> DataProto:
    """The rollout's keys (module docstring) from the (B, P) ``input_ids`` / ``attention_mask`` /
    ``position_ids`` the loop started from and its finished ``trajectories`` (row order kept).

    Every response is cut to ``response_length`` ids (the loop never makes a longer one).
    """
    input_ids, prompt_mask = prompts["input_ids"], prompts["attention_mask"]
    prompt_pos = prompts["position_ids"]
    width = response_length
    responses = _padded([t.response_ids[:width] for t in trajectories], width, pad_id, torch.long)
    response_mask = _padded([t.response_mask[:width] for t in trajectories], width, 0, torch.long)
    log_probs = _padded([t.log_probs[:width] for t in trajectories], width, 0.0, torch.float32)
    lengths = torch.tensor([min(len(t.response_ids), width) for t in trajectories])  # (B,)
    is_response = torch.arange(width)[None, :] < lengths[:, None]  # (B, R)
    offsets = torch.arange(1, width + 1, dtype=prompt_pos.dtype)
    tensors = TensorDict(
        {
            K.PROMPTS: input_ids,
            K.RESPONSES: responses,
            K.RESPONSE_MASK: response_mask,
            K.ROLLOUT_LOG_PROBS: log_probs * response_mask,
            K.INPUT_IDS: torch.cat([input_ids, responses], dim=1),
            K.ATTENTION_MASK: torch.cat([prompt_mask, is_response.to(prompt_mask.dtype)], dim=1),
            K.POSITION_IDS: torch.cat([prompt_pos, prompt_pos[:, -1:] + offsets], dim=1),
        },
        batch_size=[len(trajectories)],
    )
    return DataProto(batch=tensors, non_tensor_batch=agent_columns(trajectories), meta_info={})


def agent_columns(trajectories: Sequence[Trajectory]) -> dict[str, np.ndarray]:
    """The non-tensor columns of the module docstring, one row per trajectory."""

    def objects(values: list) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    ran = [sum(len(turn.results) for turn in t.turns if turn.role == "tool") for t in trajectories]
    return {
        K.NUM_TURNS: np.array([t.num_turns for t in trajectories], dtype=np.int32),
        K.TOOL_CALL_COUNTS: np.array(ran, dtype=np.int64),
        TOOL_REWARDS: objects([list(t.tool_rewards) for t in trajectories]),
        AGENT_TURNS: objects([[turn.to_plain() for turn in t.turns] for t in trajectories]),
        AGENT_STOP_REASON: objects([t.stop_reason for t in trajectories]),
        TURN_SCORES: objects([list(t.turn_scores) for t in trajectories]),
    }
