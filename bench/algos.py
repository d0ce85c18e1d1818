"""Time ppoflow's core algorithms against verl 0.9.1 on the same CPU inputs.

Run from the repository root:

    .venv/bin/python bench/algos.py            # B=1024, R=4096 (the lead's full run)
    .venv/bin/python bench/algos.py --small    # B=64, R=256 smoke run

Cases: GAE (compute_gae_advantage_return), GRPO outcome advantage, the vanilla policy loss with
token-mean (forward + backward), and compute_data_metrics. Each prints ours, verl's, ours/verl
and the best of k wall-clock runs (time.perf_counter). verl is imported only here, as a baseline;
a ppoflow module that is not there yet is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Best wall-clock seconds of ``repeats`` calls (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def make_inputs(batch: int, response: int, prompt: int, group: int, seed: int = 0) -> dict:
    """Right-padded responses of random length, rewards on the last token, G samples per prompt."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, response + 1, (batch,), generator=generator)
    response_mask = (torch.arange(response)[None, :] < lengths[:, None]).float()  # (B, R)
    scores = torch.zeros(batch, response)
    scores[torch.arange(batch), lengths - 1] = torch.randint(
        0, 2, (batch,), generator=generator
    ).float()
    return {
        "response_mask": response_mask,
        "token_level_rewards": scores,
        "values": torch.randn(batch, response, generator=generator) * response_mask,
        "old_log_probs": -torch.rand(batch, response, generator=generator) * 3,
        "log_probs": -torch.rand(batch, response, generator=generator) * 3,
        "advantages": torch.randn(batch, response, generator=generator),
        "uid": np.array([f"p{i // group}" for i in range(batch)], dtype=object),
        "prompts": torch.ones(batch, prompt, dtype=torch.long),
        "responses": torch.ones(batch, response, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(batch, prompt), response_mask], dim=1),
    }


def optional_import(module: str, name: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        print(f"  (skipped: ppoflow {module}.{name} not available yet: {error})")
        return None


def gae_case(x: dict) -> tuple[Callable | None, Callable]:
    from verl.trainer.ppo import core_algos

    ours = optional_import("stages.algos.advantages_token", "compute_gae_advantage_return")
    args = (x["token_level_rewards"], x["values"], x["response_mask"], 1.0, 0.95)
    return (lambda: ours(*args)) if ours else None, lambda: core_algos.compute_gae_advantage_return(
        *args
    )


def grpo_case(x: dict) -> tuple[Callable | None, Callable]:
    from verl.trainer.ppo import core_algos

    ours = optional_import("stages.algos.advantages_group", "compute_grpo_outcome_advantage")
    args = (x["token_level_rewards"], x["response_mask"], x["uid"])
    return (
        lambda: ours(*args)
    ) if ours else None, lambda: core_algos.compute_grpo_outcome_advantage(*args)


class VerlActorView:
    """The attributes verl's compute_policy_loss_vanilla reads from an ActorConfig."""

    clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c = 0.2, 0.2, 0.28, 3.0

    def __init__(self) -> None:
        self.global_batch_info: dict = {}

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key, default)


def policy_loss_case(x: dict) -> tuple[Callable | None, Callable]:
    from verl.trainer.ppo import core_algos

    from stages.algos.policy_losses import compute_policy_loss_vanilla

    verl_config = VerlActorView()
    our_config = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}

    def run(fn: Callable, config: object) -> None:
        log_prob = x["log_probs"].clone().requires_grad_(True)
        loss, _ = fn(
            x["old_log_probs"], log_prob, x["advantages"], x["response_mask"], "token-mean", config
        )
        loss.backward()

    return (lambda: run(compute_policy_loss_vanilla, our_config)), (
        lambda: run(core_algos.compute_policy_loss_vanilla, verl_config)
    )


def data_metrics_case(x: dict) -> tuple[Callable | None, Callable]:
    from verl.protocol import DataProto as VerlDataProto
    from verl.trainer.ppo import metric_utils

    tensors = {
        "token_level_scores": x["token_level_rewards"],
        "token_level_rewards": x["token_level_rewards"],
        "advantages": x["advantages"] * x["response_mask"],
        "returns": x["values"],
        "values": x["values"],
        "response_mask": x["response_mask"],
        "prompts": x["prompts"],
        "responses": x["responses"],
        "attention_mask": x["attention_mask"],
    }
    verl_batch = VerlDataProto.from_dict(tensors=tensors)
    ours = optional_import("stages.metrics.data", "compute_data_metrics")
    our_proto = optional_import("dataproto.protocol", "DataProto")
    if ours is None or our_proto is None:
        return None, lambda: metric_utils.compute_data_metrics(verl_batch, use_critic=True)
    our_batch = our_proto.from_dict(tensors)
    return (lambda: ours(our_batch, use_critic=True)), (
        lambda: metric_utils.compute_data_metrics(verl_batch, use_critic=True)
    )


CASES = {
    "gae": gae_case,
    "grpo_outcome": grpo_case,
    "policy_loss_vanilla_token_mean(fwd+bwd)": policy_loss_case,
    "compute_data_metrics": data_metrics_case,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="B=64, R=256 smoke run")
    parser.add_argument("--repeats", type=int, default=5, help="k in best-of-k")
    parser.add_argument("--only", choices=sorted(CASES), help="run a single case")
    args = parser.parse_args()
    batch, response = (64, 256) if args.small else (1024, 4096)
    x = make_inputs(batch, response, prompt=64, group=8)
    print(f"B={batch} R={response} threads={torch.get_num_threads()} best of {args.repeats}")
    print(f"{'case':42s} {'ours (s)':>10s} {'verl (s)':>10s} {'ours/verl':>10s}")
    for name, build in CASES.items():
        if args.only and name != args.only:
            continue
        ours, theirs = build(x)
        verl_s = best_of(theirs, args.repeats)
        if ours is None:
            print(f"{name:42s} {'—':>10s} {verl_s:10.4f} {'—':>10s}")
            continue
        ours_s = best_of(ours, args.repeats)
        print(f"{name:42s} {ours_s:10.4f} {verl_s:10.4f} {ours_s / verl_s:10.2f}")


if __name__ == "__main__":
    main()
