"""Route B: a batch reward model (a sequence classifier with one output) scores prompt+response.

The score of a row is the classifier's logit at its last valid token (prompt ‖ response, valid
positions from ``attention_mask``). The batch is dispatched the way a worker group receives it
(verl 0.9.1's reward-model worker): padded to a multiple of ``num_workers`` by repeating rows from row 0
(``pad_dataproto_to_divisor``), chunked into ``num_workers`` equal pieces, each scored,
concatenated, and cut back to its length (``unpad_dataproto``). The scores are then placed by the
same rule as every other score (``placement.assemble_rm_scores``).

Difference from verl (docs/differences.md, difference 2): the duplicated padding rows carry ``is_pad = True`` (a
non-tensor key travelling with the chunks), and per-worker metrics count only rows with
``is_pad = False``, so the duplicates never bias a metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dataproto import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from dataproto import keys as K

IS_PAD = K.IS_PAD
SEQ_SCORE = "rm_seq_score"  # (B,) float32, internal: one reward-model score per row


@dataclass
class ModelScores:
    """scores: (B,) float32, one per row; metrics: ``reward_model/*`` over real rows only."""

    scores: Tensor
    metrics: dict[str, float]


def right_align(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Move each row's valid tokens to the right end, keeping their order.

    A stable sort of the mask puts the 0s first and the 1s (in order) last, so the last valid
    token of every row ends at column T-1, where a last-token classifier reads it.

    Args:
        input_ids / attention_mask: (B, T).

    Returns:
        (B, T) ids, (B, T) mask and (B, T) position ids (0 on padding, 0.. on valid tokens).

    Example:
        >>> ids, mask, pos = right_align(torch.tensor([[0, 5, 6, 7, 0]]), torch.tensor([[0, 1, 1, 1, 0]]))
        >>> ids.tolist(), mask.tolist(), pos.tolist()
        ([[0, 0, 5, 6, 7]], [[0, 0, 1, 1, 1]], [[0, 0, 0, 1, 2]])
    """
    order = torch.argsort(attention_mask.long(), dim=1, stable=True)  # (B, T)
    ids = input_ids.gather(1, order)
    mask = attention_mask.gather(1, order)
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids


class RewardModel:
    """A Hugging Face ``AutoModelForSequenceClassification`` with ``num_labels = 1``.

    Args:
        model_path: directory (or hub id) of the model; it must share the policy's vocabulary,
            since it reads the batch's ``input_ids``.
        num_workers: the dispatch divisor (``reward.num_workers``).
        micro_batch_size: rows per forward pass inside a chunk (None: the whole chunk).
    """

    def __init__(
        self,
        model_path: str,
        num_workers: int = 8,
        *,
        micro_batch_size: int | None = None,
        device: str | torch.device = "cpu",
        trust_remote_code: bool = False,
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            model_path, num_labels=1, trust_remote_code=trust_remote_code
        )
        if model.config.num_labels != 1:
            raise ValueError(
                f"reward model {model_path!r} has {model.config.num_labels} labels, expected 1"
            )
        if (
            model.config.pad_token_id is None
        ):  # HF refuses batches > 1 without it; we pass embeddings
            model.config.pad_token_id = 0
        self.model = model.to(device).eval()
        self.num_workers = num_workers
        self.micro_batch_size = micro_batch_size

    @torch.no_grad()
    def score_tokens(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T) ids and mask → (B,) float32 logits at each row's last valid token."""
        vocab = self.model.get_input_embeddings().num_embeddings
        if input_ids.numel() and int(input_ids.max()) >= vocab:
            raise ValueError(
                f"token id {int(input_ids.max())} is outside the reward model's vocabulary of "
                f"{vocab}; the reward model must use the policy's tokenizer"
            )
        ids, mask, position_ids = right_align(input_ids, attention_mask)
        device = self.model.device
        embeds = self.model.get_input_embeddings()(ids.to(device))  # (B, T, H)
        out = self.model(
            inputs_embeds=embeds,
            attention_mask=mask.to(device),
            position_ids=position_ids.to(device),
        )
        return out.logits[:, 0].float().cpu()

    def _score_chunk(self, chunk: DataProto) -> DataProto:
        """One worker's share: scores for its rows, and metrics over its non-padding rows."""
        ids, mask = chunk.batch[K.INPUT_IDS], chunk.batch[K.ATTENTION_MASK]
        step = self.micro_batch_size or max(len(chunk), 1)
        scores = torch.cat(
            [
                self.score_tokens(ids[i : i + step], mask[i : i + step])
                for i in range(0, len(chunk), step)
            ]
        )
        real = torch.from_numpy(~chunk.non_tensor_batch[IS_PAD].astype(bool))  # (b,)
        metrics = {"score_sum": float(scores[real].sum()), "num_rows": int(real.sum())}
        return DataProto.from_dict(
            {SEQ_SCORE: scores}, {IS_PAD: chunk.non_tensor_batch[IS_PAD]}, {K.METRICS: metrics}
        )

    def score(self, batch: DataProto) -> ModelScores:
        """Pad to a multiple of ``num_workers``, chunk, score, concat, unpad.

        Reads ``input_ids`` (B, T) and ``attention_mask`` (B, T). Returns (B,) scores in row order.
        """
        data = DataProto.from_dict(
            {K.INPUT_IDS: batch.batch[K.INPUT_IDS], K.ATTENTION_MASK: batch.batch[K.ATTENTION_MASK]}
        )
        padded, pad_size = pad_dataproto_to_divisor(data, self.num_workers)
        padded.non_tensor_batch[IS_PAD] = np.arange(len(padded)) >= len(data)  # (B + pad,)
        outputs = [self._score_chunk(chunk) for chunk in padded.chunk(self.num_workers)]
        merged = unpad_dataproto(DataProto.concat(outputs), pad_size)
        gathered = merged.meta_info[K.METRICS]  # name → per-worker list
        num_rows = sum(gathered["num_rows"])
        scores = merged.batch[SEQ_SCORE]
        metrics = {
            "reward_model/score_mean": sum(gathered["score_sum"]) / max(num_rows, 1),
            "reward_model/num_rows": float(num_rows),
            "reward_model/num_pad_rows": float(pad_size),
        }
        return ModelScores(scores=scores, metrics=metrics)
