"""Agent rollouts: tool-call throughput of the sandbox, and the overlap gained by scoring inside
the loop, each against a baseline measured in the same run.

    flock /tmp/ppoflow-train.lock .venv/bin/python bench/agent_rollout.py [--pairs 3]

1. **Tool calls** (``ToolSandbox.run`` of the ``lookup`` tool, every call in a fresh process
   forked from the zygote, no network): calls per second at ``workers`` × ``calls`` shapes,
   against the same calls made in this process with no isolation (``LookupTool.execute``
   directly). The ratio is what isolation costs per call.
2. **Reward inside the loop**: the agent loop (``stages.agent.loop.run_agent_loop``) over B
   trajectories that finish over K rounds (an even share per round), each round a generation of
   ``gen_s`` seconds (a sleep: the engine's time, which leaves the CPUs to the scorer as a GPU
   rollout would) and scored by the real reward pool with a scorer of ``score_ms`` per sample —
   (a) inside the loop (``stages.agent.scoring.RolloutScorer``, as the rollout does), against
   (b) the loop, then the whole batch scored after it (the reward stage's order). The ratio
   (a) ÷ (b) is the step time scoring inside leaves; the saving is bounded by min(scoring time,
   generation time after the first round).

The sides alternate (A B, B A, …); the script prints each shape's medians, the per-pair ratio
medians and the load average at the start and the end. Record the figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from dataproto import DataProto
from stages.agent.loop import GeneratedTurn, LoopLimits, Trajectory, run_agent_loop
from stages.agent.sandbox import ToolCall, ToolSandbox
from stages.agent.tool_config import ToolSpec
from stages.agent.tools.lookup import LookupTool

SCORER = """import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep({seconds})
    return 1.0
"""
LOOKUP = ToolSpec(
    name="lookup",
    class_name="stages.agent.tools.lookup.LookupTool",
    config={"type": "native", "table": {"a": "alpha"}},
    schema={"type": "function", "function": {"name": "lookup", "description": "look up"}},
)


def tool_calls_per_s(sandbox: ToolSandbox, calls: int) -> float:
    batch = [ToolCall("lookup", '{"key": "a"}', {}) for _ in range(calls)]
    started = time.perf_counter()
    results = sandbox.run(batch)
    elapsed = time.perf_counter() - started
    assert all(r.status == "ok" for r in results), results[0]
    return calls / elapsed


def in_process_calls_per_s(calls: int) -> float:
    tool = LookupTool(LOOKUP.config, LOOKUP.schema)

    async def one() -> None:
        instance, _ = await tool.create()
        await tool.execute(instance, {"key": "a"})
        await tool.release(instance)

    started = time.perf_counter()
    for _ in range(calls):
        asyncio.run(one())
    return calls / (time.perf_counter() - started)


def bench_tools(pairs: int) -> None:
    print("## tool calls per second (lookup tool): sandbox vs in-process")
    print("workers  calls  sandbox/s  in-process/s  sandbox÷in-process (median of pairs)")
    for workers in (1, 2, 4):
        with ToolSandbox([LOOKUP], num_workers=workers, timeout_s=10.0) as sandbox:
            tool_calls_per_s(sandbox, 4)  # warm
            for calls in (16, 64):
                boxed, plain, ratios = [], [], []
                for i in range(pairs):
                    order = (0, 1) if i % 2 == 0 else (1, 0)
                    got = {}
                    for side in order:
                        got[side] = (
                            tool_calls_per_s(sandbox, calls)
                            if side == 0
                            else in_process_calls_per_s(calls)
                        )
                    boxed.append(got[0])
                    plain.append(got[1])
                    ratios.append(got[0] / got[1])
                print(
                    f"{workers:7d}  {calls:5d}  {statistics.median(boxed):9.0f}  "
                    f"{statistics.median(plain):12.0f}  {statistics.median(ratios):.4f}"
                )


@dataclass(frozen=True)
class _Parsed:
    content: str
    calls: tuple
    malformed: int = 0


@dataclass(frozen=True)
class _Result:
    text: str = "ok"
    reward: float | None = None
    status: str = "ok"
    seconds: float = 0.0


def loop_once(rows: int, rounds: int, gen_s: float, reward_loop, inside: bool) -> float:
    """One agent rollout's wall time (module docstring, part 2): row r calls a tool in every
    round before ``r * rounds // rows`` and stops after it."""
    from stages.agent.parsers import FunctionCall
    from stages.agent.scoring import RolloutScorer
    from stages.agent.trajectory import trajectories_to_batch

    last_round = [r * rounds // rows for r in range(rows)]
    trajectories = [Trajectory(prompt_ids=[10 + r], uses_tools=True) for r in range(rows)]

    def generate(contexts, max_new_tokens):
        time.sleep(gen_s)  # the engine's time
        return [GeneratedTurn([c[0], 1], [-0.1, -0.1], True) for c in contexts]

    def parse(ids):
        row = ids[0] - 10
        calling = trajectories[row].assistant_turns <= last_round[row]
        return _Parsed("", (FunctionCall("lookup", "{}"),) if calling else ())

    prompts = TensorDict(
        {
            "input_ids": torch.tensor([[10 + r] for r in range(rows)]),
            "attention_mask": torch.ones(rows, 1, dtype=torch.long),
            "position_ids": torch.zeros(rows, 1, dtype=torch.long),
        },
        batch_size=[rows],
    )
    columns = DataProto.from_dict(
        {"x": torch.zeros(rows)},
        {
            "data_source": np.array(["bench"] * rows, dtype=object),
            "reward_model": np.array([{"ground_truth": "1"}] * rows, dtype=object),
            "uid": np.array([str(r) for r in range(rows)], dtype=object),
        },
    )
    scorer = RolloutScorer(reward_loop, columns, prompts, 256, 0) if inside else None
    started = time.perf_counter()
    run_agent_loop(
        trajectories,
        LoopLimits(response_length=256),
        generate=generate,
        parse=parse,
        run_tools=lambda calls: [_Result() for _ in calls],
        tool_turn_ids=lambda messages, eos: [7],
        make_call=lambda *call: call,
        on_finished=None
        if scorer is None
        else lambda done: scorer.submit(done, [trajectories[i] for i in done]),
    )
    if scorer is not None:
        scorer.finish(rows)
    else:
        whole = trajectories_to_batch(prompts, trajectories, 256, 0)
        whole.non_tensor_batch.update(columns.non_tensor_batch)
        reward_loop.score(whole)
    return time.perf_counter() - started


def bench_overlap(pairs: int) -> None:
    from stages.data.tokenizer import build_tiny_tokenizer
    from stages.reward.loop import RewardLoop
    from stages.reward.settings import RewardSettings

    tokenizer = build_tiny_tokenizer()
    print("\n## reward inside the loop vs after it (sleeping engine, real reward pool, 2 workers)")
    print("rows  rounds  gen_s  score_ms  inside_s  after_s  inside÷after (median of pairs)")
    with tempfile.TemporaryDirectory() as tmp:
        for score_ms in (5, 40):
            path = Path(tmp) / f"scorer_{score_ms}.py"
            path.write_text(SCORER.format(seconds=score_ms / 1000))
            settings = RewardSettings(
                custom_path=str(path), custom_name="compute_score", num_workers=2
            )
            with RewardLoop(tokenizer, settings) as reward_loop:
                for rows, rounds, gen_s in ((32, 4, 0.2), (64, 4, 0.2), (64, 8, 0.1)):
                    inside, after, ratios = [], [], []
                    for i in range(pairs):
                        got = {}
                        for side in (True, False) if i % 2 == 0 else (False, True):
                            got[side] = loop_once(rows, rounds, gen_s, reward_loop, side)
                        inside.append(got[True])
                        after.append(got[False])
                        ratios.append(got[True] / got[False])
                    print(
                        f"{rows:4d}  {rounds:6d}  {gen_s:5.2f}  {score_ms:8d}  "
                        f"{statistics.median(inside):8.2f}  {statistics.median(after):7.2f}  "
                        f"{statistics.median(ratios):.3f}"
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    bench_tools(args.pairs)
    bench_overlap(args.pairs)
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
