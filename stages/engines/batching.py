"""How a worker walks a batch: PPO epochs × shuffled mini-batches × micro-batches.

verl semantics: one optimizer step per mini-batch of ``ppo_mini_batch_size × n`` sequences (the
global size; each of the d data-parallel ranks holds 1/d of it), ``ppo_epochs`` passes over the
batch, rows optionally shuffled with a seeded generator; each mini-batch is cut into micro-batches
(a fixed row count, or a token budget under ``use_dynamic_bsz``) whose gradients accumulate.
The loss denominators are those of the whole mini-batch on all ranks (:func:`global_batch_info`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.micro_batch import split_by_token_budget, split_fixed_size_by_length


@dataclass(frozen=True)
class MicroBatching:
    """How rows are grouped for one forward/backward pass.

    micro_batch_size: rows per micro-batch (None = the whole mini-batch at once).
    use_dynamic_bsz: group by a token budget instead of a row count.
    max_token_len: the token budget per micro-batch (prompt + response tokens).
    """

    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384

    def plan(self, attention_mask: Tensor) -> list[list[int]]:
        """Row-index lists, one per micro-batch, covering every row of ``attention_mask`` once.

        Under a token budget with several data-parallel ranks, every rank uses the same number of
        micro-batches (the largest any rank needs): under ZeRO-3 each forward is a collective, so
        ranks with different counts would wait on each other forever. The count is agreed by an
        all-reduce on ``attention_mask``'s device (the engine's: NCCL takes only CUDA tensors).
        """
        rows = attention_mask.shape[0]
        if not self.use_dynamic_bsz:
            return split_fixed_size_by_length(attention_mask, self.micro_batch_size or rows)
        plan = split_by_token_budget(attention_mask, max_token_len=self.max_token_len)
        for _ in range(3):
            agreed = _max_over_ranks(len(plan), attention_mask.device)
            if agreed == len(plan):
                return plan
            plan = split_by_token_budget(
                attention_mask, max_token_len=self.max_token_len, min_num_micro_batches=agreed
            )
        raise RuntimeError(
            f"data-parallel ranks could not agree on a micro-batch count under the token budget "
            f"{self.max_token_len} (this rank: {len(plan)}); raise ppo_max_token_len_per_gpu"
        )


def _max_over_ranks(count: int, device: torch.device) -> int:
    """The largest ``count`` over the data-parallel ranks (``count`` itself with one rank), agreed
    by an all-reduce of a tensor on ``device`` (the device the process group's backend reduces
    on: the engine's)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return count
    value = torch.tensor([count], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return int(value.item())


def mini_batch_indices(
    rows: int, mini_batch_rows: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[Tensor]:
    """Row indices of each mini-batch, epoch after epoch (``epochs × rows / mini_batch_rows``).

    Example:
        >>> [t.tolist() for t in mini_batch_indices(4, 2, epochs=2, shuffle=False, seed=0)]
        [[0, 1], [2, 3], [0, 1], [2, 3]]
    """
    if mini_batch_rows < 1 or rows % mini_batch_rows:
        raise ValueError(
            f"the batch of {rows} rows (on this rank) is not a multiple of the mini-batch of "
            f"{mini_batch_rows} rows; make train_batch_size × n a multiple of ppo_mini_batch_size × n"
        )
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator) if shuffle else torch.arange(rows)
        yield from order.split(mini_batch_rows)


def global_batch_info(
    response_mask: Tensor, loss_scale_factor: float | None = None
) -> GlobalBatchInfo:
    """The mini-batch's denominators over all data-parallel ranks.

    batch_num_tokens = Σ response_mask, all-reduced (sum) over ranks;
    global_batch_size = rows of this rank's mini-batch × d; dp_size = d.
    """
    dp_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    num_tokens = response_mask.sum()  # 0-d int64, stays on the device (no host sync)
    if dp_size > 1:
        torch.distributed.all_reduce(num_tokens)
    return GlobalBatchInfo(
        dp_size=dp_size,
        batch_num_tokens=num_tokens,
        global_batch_size=response_mask.shape[0] * dp_size,
        loss_scale_factor=loss_scale_factor,
    )
