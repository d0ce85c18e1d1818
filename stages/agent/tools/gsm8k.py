"""verl's GSM8K tool (``verl.tools.gsm8k_tool.Gsm8kTool``): the model submits an answer, the tool
scores it against the sample's ground truth and says so.

Semantics carried over from verl 0.9.1:

- ``create(create_kwargs={"ground_truth": ...})`` (or ``ground_truth=``) keeps per-instance state
  ``{response, ground_truth, reward}``; ``release`` drops it;
- ``execute`` takes ``answer`` (a non-str is ``str()``-ed), scores ``"#### " + answer`` (unless it
  already starts so) with the GSM8K scorer in ``flexible`` mode (:mod:`stages.reward.scorers.gsm8k`:
  the last number-like token, compared with the ground truth as a string): ``calc_reward`` is 1.0
  or 0.0;
- the text is ``Current parsed answer='<answer>' reward=<1.0 | 0.0>``;
- the step reward it returns is not that score but verl's penalty for a submission that does not
  improve on the instance's last one: 0.0 if the score rose, else -0.05. As the agent loop makes
  one instance per call (its reward starts at 0.0), a correct answer gives 0.0 and any other
  -0.05. The sample's final reward comes from the reward stage, as in verl.

Example:
    >>> import asyncio
    >>> schema = {"type": "function", "function": {"name": "calc_gsm8k_reward"}}
    >>> tool = Gsm8kTool({"type": "native"}, schema)
    >>> async def call(answer):
    ...     instance_id, _ = await tool.create(create_kwargs={"ground_truth": "72"})
    ...     response, reward, _ = await tool.execute(instance_id, {"answer": answer})
    ...     await tool.release(instance_id)
    ...     return response.text, reward
    >>> asyncio.run(call("72"))
    ("Current parsed answer='72' reward=1.0", 0.0)
    >>> asyncio.run(call("71"))
    ("Current parsed answer='71' reward=0.0", -0.05)
"""

from __future__ import annotations

from typing import Any

from stages.agent.tool_api import BaseTool, ToolResponse
from stages.reward.scorers import gsm8k

NO_IMPROVEMENT_PENALTY = -0.05  # verl's step reward for an answer that does not raise the score


class Gsm8kTool(BaseTool):
    """Scores a GSM8K answer against the instance's ground truth (module docstring)."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self._instance_dict: dict[str, dict[str, Any]] = {}

    async def create(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instance_dict[instance_id] = {
            "response": "",
            "ground_truth": ground_truth,
            "reward": 0.0,
        }
        return instance_id, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        answer = parameters.get("answer", "")
        if not isinstance(answer, str):
            answer = str(answer)
        state = self._instance_dict[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        tool_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), tool_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """1.0 if the instance's answer equals its ground truth (flexible extraction), else 0.0."""
        state = self._instance_dict[instance_id]
        return gsm8k.compute_score(
            state["response"], state["ground_truth"], method="flexible", format_score=0.0, score=1.0
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        del self._instance_dict[instance_id]
