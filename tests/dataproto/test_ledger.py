"""Token ledger: the seed's five quantities on a hand-checkable batch, from parameters and from data."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from dataproto.ledger import TokenLedger, ledger_from_batch, ledger_from_params
from dataproto.protocol import DataProto
from dataproto.sample_batch import make_sample_batch


def _batch(lengths, prompt_lengths, response_width=4, prompt_width=4, rm_at=None):
    """Rows with left-padded prompts and right-padded responses; rm_scores 1.0 at ``rm_at``."""
    rows = len(lengths)
    cols_p, cols_r = torch.arange(prompt_width), torch.arange(response_width)
    prompt_mask = torch.stack([(cols_p >= prompt_width - p).long() for p in prompt_lengths])
    response_mask = torch.stack([(cols_r < length).long() for length in lengths])
    rm_scores = torch.zeros(rows, response_width)
    for row, col in rm_at or []:
        rm_scores[row, col] = 1.0
    td = TensorDict(
        {
            "responses": torch.full((rows, response_width), 7) * response_mask,
            "attention_mask": torch.cat([prompt_mask, response_mask], -1),
            "response_mask": response_mask,
            "rm_scores": rm_scores,
        },
        batch_size=[rows],
    )
    return DataProto(batch=td)


def test_hand_checked_example_from_parameters():
    # B=2, n=2, P=4, R=4, L = [4, 2, 0, 1]
    led = ledger_from_params(2, 2, 4, 4, [4, 2, 0, 1])
    assert (led.rows, led.valid_response_tokens, led.reward_rows, led.aborted_rows) == (4, 7, 3, 1)
    assert (led.prompt_tokens, led.total_tokens) == (16, 23)
    assert led.token_mean_weight == pytest.approx(1 / 7)
    text = led.format()
    assert "1/7" in text and "23" in text and "B=2 prompts × n=2 samples" in text


def test_default_lengths_are_full_responses():
    led = ledger_from_params(3, 4, 10, 5)
    assert (led.rows, led.valid_response_tokens, led.total_tokens, led.aborted_rows) == (
        12,
        60,
        180,
        0,
    )


def test_same_example_from_a_batch_with_reward_at_last_valid_token():
    data = _batch([4, 2, 0, 1], [4, 4, 4, 4], rm_at=[(0, 3), (1, 1), (3, 0)])
    led = ledger_from_batch(data)
    expected = ledger_from_params(2, 2, 4, 4, [4, 2, 0, 1])
    fields = ("rows", "valid_response_tokens", "reward_rows", "aborted_rows", "total_tokens")
    assert [getattr(led, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert (led.rm_nonzero, led.rm_at_last_token, led.rm_misplaced) == (3, 3, ())


def test_verl_style_padding_write_for_aborted_row_is_flagged():
    # verl writes an aborted row's reward at index L_i − 1 = −1, i.e. the last (padding) column
    data = _batch([4, 2, 0, 1], [4, 4, 4, 4], rm_at=[(0, 3), (1, 1), (2, 3), (3, 0)])
    led = ledger_from_batch(data)
    assert (led.rm_nonzero, led.rm_at_last_token, led.rm_misplaced) == (4, 3, ((2, 3),))
    assert "(2, 3)" in led.format()


def test_padded_prompts_count_only_valid_prompt_tokens():
    led = ledger_from_batch(_batch([1, 1], [4, 2]))
    assert (led.prompt_tokens, led.valid_response_tokens, led.total_tokens) == (6, 2, 8)


def test_multi_turn_loss_mask_smaller_than_lengths():
    data = _batch([4, 3], [4, 4])
    data.batch["response_mask"][0, 1] = 0  # a tool token inside row 0's response
    led = ledger_from_batch(data)
    assert (led.valid_response_tokens, led.loss_tokens) == (7, 6)
    assert led.token_mean_weight == pytest.approx(1 / 6)
    assert "loss-mask tokens" in led.format()


def test_oracle_loop_on_sample_batches():
    for seed in range(5):
        data = make_sample_batch(batch_size=3, n=3, prompt_len=5, response_len=6, seed=seed)
        mask = data.batch["attention_mask"].tolist()
        lengths = [sum(row[-6:]) for row in mask]
        led = ledger_from_batch(data)
        assert led.valid_response_tokens == sum(lengths)
        assert led.aborted_rows == sum(1 for x in lengths if x == 0)
        assert led.total_tokens == sum(sum(row) for row in mask)
        assert led.rm_at_last_token == led.rm_nonzero == led.reward_rows
        assert led.rm_misplaced == ()


def test_dp_note_and_zero_token_weight():
    led = ledger_from_params(2, 1, 3, 4, [2, 2], dp_size=4)
    assert "4/4 × local sum" not in led.format()  # the fraction is reduced: 4/4 → 1
    assert "per-rank scale (dp_size=4)" in led.format() and "1 × local sum" in led.format()
    empty = ledger_from_params(1, 2, 3, 4, [0, 0])
    assert empty.token_mean_weight is None and "undefined" in empty.format()
    assert isinstance(empty, TokenLedger)


def test_parameter_errors_name_both_numbers():
    with pytest.raises(ValueError, match=r"got 3 lengths, expected B·n = 2·2 = 4"):
        ledger_from_params(2, 2, 4, 4, [1, 2, 3])
    with pytest.raises(ValueError, match=r"length 5 of row 1 is outside \[0, R\] = \[0, 4\]"):
        ledger_from_params(1, 2, 4, 4, [1, 5])
    with pytest.raises(ValueError, match="n \\(samples per prompt\\) must be an integer ≥ 1"):
        ledger_from_params(1, 0, 4, 4)


def test_batch_without_needed_keys():
    td = TensorDict({"responses": torch.zeros(2, 3)}, batch_size=[2])
    with pytest.raises(KeyError, match="attention_mask"):
        ledger_from_batch(DataProto(batch=td))
    with pytest.raises(KeyError, match="no tensors"):
        ledger_from_batch(DataProto())
