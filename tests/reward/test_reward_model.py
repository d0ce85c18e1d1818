"""Route B: a tiny random-init sequence classifier, dispatched by pad → chunk → score → concat → unpad."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config

from stages.reward.reward_model import RewardModel, right_align


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    path = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(path)
    return str(path)


def oracle_scores(model, batch) -> torch.Tensor:
    """Each row alone, valid tokens only, no padding: the logit at its last token."""
    out = []
    for ids, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"]):
        valid = ids[mask.bool()].unsqueeze(0)
        out.append(model(input_ids=valid).logits[0, 0])
    return torch.stack(out)


def test_thirteen_rows_with_eight_workers(rm_path, batch_factory):
    rm = RewardModel(rm_path, num_workers=8)
    batch = batch_factory(
        [f"resp{i}" * (1 + i % 2) for i in range(13)], prompt_width=8, response_width=12
    )
    result = rm.score(batch)
    assert result.scores.shape == (13,) and result.scores.dtype == torch.float32
    with torch.no_grad():
        expected = oracle_scores(rm.model, batch)
    torch.testing.assert_close(result.scores, expected, atol=1e-4, rtol=1e-4)
    # 3 padding rows (copies of rows 0, 1, 2) were scored but never counted
    assert result.metrics["reward_model/num_rows"] == 13.0
    assert result.metrics["reward_model/num_pad_rows"] == 3.0
    assert result.metrics["reward_model/score_mean"] == pytest.approx(
        float(expected.mean()), abs=1e-5
    )
    padded_mean = float(torch.cat([expected, expected[:3]]).mean())
    assert result.metrics["reward_model/score_mean"] != pytest.approx(padded_mean, abs=1e-6)


def test_micro_batches_and_fewer_rows_than_workers(rm_path, batch_factory):
    batch = batch_factory(["a", "bb", "ccc"], prompt_width=4, response_width=6)
    whole = RewardModel(rm_path, num_workers=1).score(batch).scores
    split = RewardModel(rm_path, num_workers=8, micro_batch_size=1).score(batch)
    torch.testing.assert_close(split.scores, whole, atol=1e-5, rtol=1e-5)
    assert split.metrics["reward_model/num_pad_rows"] == 5.0


def test_right_align_keeps_order():
    ids = torch.tensor([[0, 5, 6, 0, 0], [7, 8, 9, 1, 2]])
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    aligned, new_mask, pos = right_align(ids, mask)
    assert aligned.tolist() == [[0, 0, 0, 5, 6], [7, 8, 9, 1, 2]]
    assert new_mask.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    assert pos.tolist() == [[0, 0, 0, 0, 1], [0, 1, 2, 3, 4]]


def test_token_outside_vocabulary(rm_path):
    rm = RewardModel(rm_path, num_workers=1)
    with pytest.raises(ValueError, match="outside the reward model's vocabulary"):
        rm.score_tokens(torch.tensor([[10_000]]), torch.tensor([[1]]))
