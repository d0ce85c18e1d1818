"""The placement rule: score at L_i - 1, nothing for L_i = 0 (docs/differences.md, difference 1)."""

from __future__ import annotations

import pytest
import torch

from stages.reward.placement import assemble_rm_scores, response_lengths


def mask_of(
    lengths: list[int], width: int, prompt_mask: list[list[int]] | None = None
) -> torch.Tensor:
    response = (torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)).long()
    if prompt_mask is None:
        return response
    return torch.cat([torch.tensor(prompt_mask), response], dim=1)


def loop_oracle(scores: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.zeros(len(scores), width)
    for i, n in enumerate(lengths.tolist()):
        if n > 0:
            out[i, n - 1] = scores[i]
    return out


def test_cases_zero_one_full_mixed():
    scores = torch.tensor([1.5, -2.0, 3.0, 0.25])
    rm_scores, aborted = assemble_rm_scores(scores, mask_of([0, 1, 4, 2], 4))
    expected = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0], [-2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 3.0], [0.0, 0.25, 0.0, 0.0]]
    )
    assert torch.equal(rm_scores, expected)
    assert aborted.tolist() == [True, False, False, False]
    assert rm_scores.dtype == torch.float32


def test_sum_recovers_scores_and_padding_stays_zero():
    torch.manual_seed(0)
    lengths = torch.randint(0, 9, (64,))
    mask = mask_of(lengths.tolist(), 8)
    scores = torch.randn(64)
    rm_scores, aborted = assemble_rm_scores(scores, mask)
    assert torch.equal(aborted, lengths == 0)
    assert torch.allclose(rm_scores.sum(-1), torch.where(aborted, 0.0, scores))
    assert torch.all(rm_scores[mask == 0] == 0)
    assert torch.equal(rm_scores, loop_oracle(scores, lengths, 8))


def test_full_sequence_mask_reads_only_the_response_part():
    prompt = [[0, 1, 1], [1, 1, 1]]
    full = mask_of([2, 0], 4, prompt)
    rm_scores, aborted = assemble_rm_scores(torch.tensor([1.0, 5.0]), full, response_width=4)
    assert rm_scores.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0] * 4]
    assert aborted.tolist() == [False, True]
    other_prompt = mask_of([2, 0], 4, [[1, 1, 1], [0, 0, 1]])  # invariance to the prompt part
    assert torch.equal(assemble_rm_scores(torch.tensor([1.0, 5.0]), other_prompt, 4)[0], rm_scores)
    assert response_lengths(full, 4).tolist() == [2, 0]


def test_nan_score_of_an_aborted_row_is_not_written():
    rm_scores, _ = assemble_rm_scores(torch.tensor([float("nan")]), mask_of([0], 3))
    assert torch.equal(rm_scores, torch.zeros(1, 3))


def test_shape_errors():
    with pytest.raises(ValueError, match=r"scores must be \(B,\)"):
        assemble_rm_scores(torch.zeros(3), mask_of([1, 1], 4))
    with pytest.raises(ValueError, match="T >= R"):
        response_lengths(torch.ones(2, 3), 5)
