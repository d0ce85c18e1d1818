"""The advantage step: read the batch, run the named estimator, hand back advantages and returns.

Two entry points over the same estimator registry (:data:`stages.algos.advantages.ADV_ESTIMATORS`):

- :func:`compute_advantage` (ppoflow): returns a *delta* ``DataProto`` holding only ``advantages``
  and ``returns``; the input batch is never modified. The stage unions the delta.
- :func:`compute_advantage_inplace` (verl port): verl 0.9.1's ``ray_trainer.compute_advantage``
  signature and behaviour — it writes ``advantages``, ``returns`` (and a missing ``response_mask``)
  into ``data.batch`` and returns ``data``. Port with
  ``from stages.algos.compute_advantage import compute_advantage_inplace as compute_advantage``.

Inputs read: ``token_level_rewards`` (B, R); ``response_mask`` (B, R), derived from
``attention_mask[:, -R:]`` when absent (layout checked, see :func:`response_mask_from_attention`);
and, when present, ``uid`` (group estimators), ``values`` (gae), ``reward_baselines`` (remax).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import keys
from dataproto.protocol import DataProto
from stages.algos.advantages import get_adv_estimator_fn
from stages.algos.config_view import sets_verl_only_flag, with_overrides


def response_mask_from_attention(attention_mask: Tensor, response_length: int) -> Tensor:
    """``attention_mask[:, -R:]`` after checking the padding layout (a difference from verl).

    The layout must be: prompt left-padded (zeros, then ones) and response right-padded (ones,
    then zeros). verl slices without checking, so any other layout silently misaligns the mask.

    Args:
        attention_mask: (B, T) {0, 1}, T = P + R.
        response_length: R, the width of ``responses``.

    Returns:
        (B, R) response mask, same dtype as ``attention_mask``.

    Example:
        >>> response_mask_from_attention(torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]]), 3)
        tensor([[1, 1, 0],
                [1, 0, 0]])
    """
    total = attention_mask.shape[-1]
    if not 0 <= response_length <= total:
        raise ValueError(
            f"response length {response_length} does not fit attention_mask of width {total}"
        )
    prompt_part = attention_mask[:, : total - response_length].bool()
    response_part = attention_mask[:, total - response_length :]
    response_bool = response_part.bool()
    bad_response = (response_bool[:, 1:] & ~response_bool[:, :-1]).any(dim=-1)  # a 1 after a 0
    bad_prompt = (prompt_part[:, :-1] & ~prompt_part[:, 1:]).any(dim=-1)  # a 0 after a 1
    for name, bad, how in (
        ("response", bad_response, "right-padded (ones, then zeros)"),
        ("prompt", bad_prompt, "left-padded (zeros, then ones)"),
    ):
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0])
            raise ValueError(
                f"cannot derive response_mask from attention_mask: row {row}'s {name} part is not {how}: "
                f"{attention_mask[row].tolist()} (R={response_length}). Provide 'response_mask' explicitly "
                "(multi-turn rollouts do) or fix the padding"
            )
    return response_part


def compute_response_mask(data: DataProto) -> Tensor:
    """verl's ``compute_response_mask``: R from ``responses`` (else ``token_level_rewards``), layout-checked."""
    batch = _tensors(data, "compute_response_mask")
    width_key = keys.RESPONSES if keys.RESPONSES in batch else keys.TOKEN_LEVEL_REWARDS
    _need(batch, keys.ATTENTION_MASK, "response_mask derivation")
    _need(batch, width_key, "response_mask derivation")
    return response_mask_from_attention(batch[keys.ATTENTION_MASK], batch[width_key].shape[-1])


def compute_advantage(
    batch: DataProto,
    adv_estimator: str | Enum,
    *,
    gamma: float | None = None,
    lam: float | None = None,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> DataProto:
    """Run estimator ``adv_estimator`` on ``batch``; return ``DataProto`` with ``advantages`` and ``returns``.

    ``gamma``, ``lam`` and ``norm_adv_by_std_in_grpo`` default to ``config``'s fields, then to their
    defaults (:mod:`stages.algos.defaults`: 1.0, 1.0, True, as verl's); giving a keyword that contradicts ``config``
    raises ``ValueError``.
    The input batch is not modified.

    Returns:
        A new DataProto: batch {advantages (B, R), returns (B, R)}, empty non-tensor and meta layers.

    Example:
        >>> import numpy as np
        >>> batch = DataProto(TensorDict({"token_level_rewards": torch.tensor([[1., 0.], [0., 0.]]),
        ...                               "response_mask": torch.tensor([[1, 0], [1, 1]])}, batch_size=[2]),
        ...                   {"uid": np.array(["p0", "p0"], dtype=object)}, {})
        >>> compute_advantage(batch, "grpo").batch["advantages"]
        tensor([[ 0.7071,  0.0000],
                [-0.7071, -0.7071]])
    """
    advantages, returns, _ = _estimate(
        batch, adv_estimator, gamma, lam, norm_adv_by_std_in_grpo, config
    )
    tensors = TensorDict(
        {keys.ADVANTAGES: advantages, keys.RETURNS: returns},
        batch_size=[advantages.shape[0]],
        device=advantages.device,
    )
    return DataProto(batch=tensors, non_tensor_batch={}, meta_info={})


def compute_advantage_inplace(
    data: DataProto,
    adv_estimator: str | Enum,
    gamma: float | None = None,
    lam: float | None = None,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
) -> DataProto:
    """verl's ``compute_advantage``: writes advantages/returns (and a missing response_mask) into ``data``.

    ``num_repeat`` is accepted and unused, as in verl. Parameter resolution is
    :func:`compute_advantage`'s; verl instead reads gamma/lam from the arguments for GAE and from the
    config for REINFORCE++, which only differs when the two disagree (ppoflow raises then).
    """
    advantages, returns, response_mask = _estimate(
        data, adv_estimator, gamma, lam, norm_adv_by_std_in_grpo, config
    )
    data.batch[keys.RESPONSE_MASK] = response_mask
    data.batch[keys.ADVANTAGES] = advantages
    data.batch[keys.RETURNS] = returns
    return data


def _estimate(
    batch: DataProto, adv_estimator: str | Enum, gamma, lam, norm_adv_by_std_in_grpo, config
) -> tuple[Tensor, Tensor, Tensor]:
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator
    estimator = get_adv_estimator_fn(name)
    config = with_overrides(
        config, gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo
    )
    if sets_verl_only_flag(config, "use_pf_ppo"):
        raise NotImplementedError(
            "algorithm.use_pf_ppo (PF-PPO resampling after GAE) is not implemented in ppoflow"
        )
    tensors = _tensors(batch, f"advantage estimator {name!r}")
    rewards = _need(tensors, keys.TOKEN_LEVEL_REWARDS, f"advantage estimator {name!r}")
    if keys.RESPONSE_MASK in tensors:
        response_mask = tensors[keys.RESPONSE_MASK]
    else:
        response_mask = compute_response_mask(batch)
    inputs: dict[str, Any] = {}
    if keys.UID in batch.non_tensor_batch:
        inputs["index"] = batch.non_tensor_batch[keys.UID]
    for key in (keys.VALUES, keys.REWARD_BASELINES):
        if key in tensors:
            inputs[key] = tensors[key]
    advantages, returns = estimator(
        token_level_rewards=rewards, response_mask=response_mask, config=config, **inputs
    )
    return advantages, returns, response_mask


def _tensors(batch: DataProto, reader: str) -> TensorDict:
    if batch.batch is None:
        raise ValueError(f"{reader} needs a tensor batch, but batch.batch is None")
    return batch.batch


def _need(tensors: TensorDict, key: str, reader: str) -> Tensor:
    if key not in tensors:
        raise KeyError(f"{reader} needs batch key {key!r}; the batch has {sorted(tensors.keys())}")
    return tensors[key]
