"""A small actor worker for the worker-group tests: the tiny LM in a DeepSpeed engine.

It is imported as the top-level module ``ray_toy_worker``: the test puts this directory on the
Ray actors' PYTHONPATH (``RayWorkerGroup(env={"PYTHONPATH": ...})``) and loads the same file in
the driver under that name, so the factory pickles by reference and resolves on both sides.
"""

from __future__ import annotations

import deepspeed
import torch

from dataproto import DataProto, keys
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm

LOSS_CONFIG = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}


class ToyActorWorker:
    """The actor role on one rank: ``compute_log_prob`` and ``update_actor`` over DataProto.

    mini_batch_size: rows per optimizer step on this rank (global mini-batch / world size).
    micro_batch_size: rows per forward/backward (None = the whole mini-batch).
    """

    def __init__(
        self,
        model_dir: str,
        zero_stage: int = 0,
        mini_batch_size: int = 4,
        micro_batch_size: int | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.reset(zero_stage, mini_batch_size, micro_batch_size)

    def reset(self, zero_stage: int, mini_batch_size: int, micro_batch_size: int | None) -> int:
        """A fresh engine from the saved model (same initial weights on every rank)."""
        torch.manual_seed(0)
        # A large Adam eps, as in test_actor: pure-rounding-noise gradients stay negligible.
        self.engine = initialize_engine(
            ResponseLogProbModel(load_causal_lm(self.model_dir)),
            EngineSettings(zero_stage=zero_stage, lr=1e-2, eps=1e-3, clip_grad=1.0),
        )
        self.settings = PPOUpdateSettings(
            mini_batch_size=mini_batch_size, micro=MicroBatching(micro_batch_size=micro_batch_size)
        )
        return torch.distributed.get_world_size()

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """old_log_probs, plus ``echo_is_pad`` (the flag each row arrived with) and the flag
        passed through unchanged, which the group must drop."""
        delta, metrics = compute_log_prob(self.engine, batch, MicroBatching(micro_batch_size=2))
        is_pad = batch.non_tensor_batch[keys.IS_PAD]
        delta.batch["echo_is_pad"] = torch.as_tensor(is_pad)
        delta.non_tensor_batch[keys.IS_PAD] = is_pad
        delta.meta_info["metrics"] = {**metrics, "toy/pad_rows": int(is_pad.sum())}
        return delta

    def update_actor(self, batch: DataProto) -> DataProto:
        metrics = update_actor(self.engine, batch, self.settings, LOSS_CONFIG)
        return DataProto(batch=None, non_tensor_batch={}, meta_info={"metrics": metrics})

    def gathered_weights(self) -> dict[str, torch.Tensor]:
        """Full parameters (a collective under ZeRO-3: call on every rank at once)."""
        params = dict(self.engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {name: p.detach().clone() for name, p in params.items()}

    def echo_rows(self, batch: DataProto, skew_rank: int | None = None) -> DataProto:
        """The chunk's ``x`` back (plus 1 on ``skew_rank``), and this rank's index as metric
        ``toy/rank``."""
        rank = torch.distributed.get_rank()
        x = batch.batch["x"] + int(rank == skew_rank)
        return DataProto.from_dict({"x": x}, meta_info={"metrics": {"toy/rank": float(rank)}})

    def fail_on_rank(self, failing_rank: int) -> None:
        """Raise on ``failing_rank``; every other rank waits in a barrier it never completes."""
        if torch.distributed.get_rank() == failing_rank:
            raise ValueError(f"rank {failing_rank} fails on purpose")
        torch.distributed.barrier()
