"""A realistic synthetic rollout batch, for demos (``ppoflow make-sample-batch``), tests and benches.

Layout (verl's): B prompts, each sampled n times, rows interleaved (prompt 0's n samples first).
Prompts are left-padded to P, responses right-padded to R, ``input_ids = prompts ‖ responses``,
``attention_mask`` marks the valid tokens of both parts, ``position_ids`` count valid tokens from
0. Some responses have length L_i = 0 (aborted rows). ``rm_scores`` holds a ±1 outcome reward at
column L_i − 1 of each row with L_i > 0 and nothing elsewhere (aborted rows get no reward).
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from dataproto import keys

PAD_ID, EOS_ID, FIRST_TOKEN_ID = 0, 2, 3
_SOURCES = ("openai/gsm8k", "lighteval/MATH")


def _left_padded(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) {0,1} mask with lengths[i] ones at the right end of row i."""
    cols = torch.arange(width)
    return (cols >= width - lengths[:, None]).long()


def _right_padded(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) {0,1} mask with lengths[i] ones at the left end of row i."""
    return (torch.arange(width) < lengths[:, None]).long()


def sample_lengths(rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """(rows,) response lengths in [0, width]: ~1 in 8 rows aborted (at least one once rows ≥ 4),
    ~1 in 4 truncated at ``width``, the others in between."""
    lengths = torch.randint(1, max(width, 1) + 1, (rows,), generator=gen)
    draw = torch.rand(rows, generator=gen)
    lengths = torch.where(draw < 0.25, torch.full_like(lengths, width), lengths)
    lengths = torch.where(draw > 0.875, torch.zeros_like(lengths), lengths)
    if rows >= 4 and not bool((lengths == 0).any()):
        lengths[-1] = 0
    return lengths.clamp(max=width)


def make_sample_batch(
    batch_size: int = 4,
    n: int = 2,
    prompt_len: int = 16,
    response_len: int = 32,
    seed: int = 0,
    vocab_size: int = 1000,
):
    """A synthetic rollout DataProto (module docstring) with B·n rows.

    Tensors: input_ids, attention_mask, position_ids (B·n, P+R); prompts (B·n, P);
    responses, response_mask, rollout_log_probs, rm_scores (B·n, R).
    Non-tensors: uid, data_source (str), reward_model (dict). meta_info: temperature,
    global_steps, global_token_num.

    >>> data = make_sample_batch(batch_size=2, n=2, prompt_len=4, response_len=6, seed=1)
    >>> data.batch["input_ids"].shape, list(data.non_tensor_batch["uid"][:2])
    (torch.Size([4, 10]), ['prompt-1-0', 'prompt-1-0'])
    """
    from dataproto.protocol import DataProto

    if min(batch_size, n, prompt_len, response_len) < 1:
        raise ValueError(
            f"batch_size, n, prompt_len and response_len must be ≥ 1, got "
            f"{batch_size}, {n}, {prompt_len}, {response_len}"
        )
    gen = torch.Generator().manual_seed(seed)
    prompts, prompt_mask = _prompt_part(batch_size, n, prompt_len, vocab_size, gen)
    tensors = _response_part(batch_size * n, response_len, vocab_size, gen)
    attention_mask = torch.cat([prompt_mask, tensors[keys.RESPONSE_MASK]], dim=-1)  # (B·n, P+R)
    tensors |= {
        keys.PROMPTS: prompts,
        keys.INPUT_IDS: torch.cat([prompts, tensors[keys.RESPONSES]], dim=-1),
        keys.ATTENTION_MASK: attention_mask,
        keys.POSITION_IDS: (attention_mask.cumsum(-1) - 1).clamp(min=0),
    }
    prompt_ids = np.repeat(np.arange(batch_size), n)
    non_tensor = {
        keys.UID: _objects([f"prompt-{seed}-{i}" for i in prompt_ids]),
        keys.DATA_SOURCE: _objects([_SOURCES[i % 2] for i in prompt_ids]),
        keys.REWARD_MODEL: _objects(
            [{"style": "rule", "ground_truth": str(7 * int(i) + seed)} for i in prompt_ids]
        ),
    }
    meta_info = {
        keys.TEMPERATURE: 1.0,
        keys.GLOBAL_STEPS: 1,
        keys.GLOBAL_TOKEN_NUM: attention_mask.sum(-1).tolist(),
    }
    batch = TensorDict(tensors, batch_size=[batch_size * n])
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)


def _prompt_part(
    batch_size: int, n: int, prompt_len: int, vocab_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompts, prompt mask), both (B·n, P): B left-padded prompts, each repeated n times."""
    lengths = torch.randint(1, prompt_len + 1, (batch_size,), generator=gen)
    mask = _left_padded(lengths, prompt_len).repeat_interleave(n, dim=0)
    tokens = torch.randint(FIRST_TOKEN_ID, vocab_size, (batch_size, prompt_len), generator=gen)
    return tokens.repeat_interleave(n, dim=0) * mask, mask


def _response_part(
    rows: int, response_len: int, vocab_size: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """responses, response_mask, rollout_log_probs and rm_scores, each (rows, R), right-padded."""
    lengths = sample_lengths(rows, response_len, gen)  # (rows,) L_i
    mask = _right_padded(lengths, response_len)  # (rows, R)
    responses = torch.randint(FIRST_TOKEN_ID, vocab_size, (rows, response_len), generator=gen)
    ended = (lengths > 0) & (lengths < response_len)  # finished with EOS inside the window
    responses[ended, lengths[ended] - 1] = EOS_ID
    log_probs = -torch.rand(rows, response_len, generator=gen) * 3 * mask + 0.0  # + 0.0: no -0.0
    scores = torch.where(torch.rand(rows, generator=gen) < 0.5, 1.0, -1.0)  # ±1 outcome reward
    rm_scores = torch.zeros(rows, response_len)
    has_reward = lengths > 0  # aborted rows (L_i = 0) get nothing
    rm_scores[has_reward, lengths[has_reward] - 1] = scores[has_reward]
    return {
        keys.RESPONSES: responses * mask,
        keys.RESPONSE_MASK: mask,
        keys.ROLLOUT_LOG_PROBS: log_probs.float(),
        keys.RM_SCORES: rm_scores,
    }


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
