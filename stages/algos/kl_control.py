"""KL-in-reward: the KL coefficient controllers and the reward penalty they scale.

When ``algorithm.use_kl_in_reward`` is set, the reward each token earns is reduced by β times a
per-token KL estimate between the rollout policy (``old_log_probs``) and the reference policy
(``ref_log_prob``) *before* advantages are computed (KL in the loss, by contrast, is added in the
actor mini-batch from the current log-probs). β comes from a controller:

- ``fixed``: β = ``kl_coef`` forever.
- ``adaptive`` (Ziegler et al., arXiv:1909.08593): after each step,
  β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n_steps/horizon), n_steps = the batch size.

Each is a ``KL_CONTROLLERS`` entry (:class:`KLControllerSpec`) that declares the ``kl_ctrl``
fields it needs > 0, which the config checks instead of comparing the type's name.

Metrics are Python floats: the adaptive controller needs the step's KL on the host anyway, so
:func:`kl_penalized_rewards` returns a 0-d tensor and the one host transfer happens here, at the
controller boundary (one sync per step).

Example (adaptive, target 0.05, horizon 1000, 100 samples with KL 0.2 → clipped error +0.2):
    >>> ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    >>> ctrl.update(current_kl=0.2, n_steps=100)
    >>> round(ctrl.value, 6)
    0.102
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tensordict import TensorDict
from torch import Tensor

from dataproto import keys
from dataproto.protocol import DataProto
from stages.algos.config_view import read_field
from stages.algos.kl import kl_penalty as kl_estimate
from stages.algos.masked import masked_mean
from stages.registry import Registry

#: the proportional error KL/target − 1 is clipped to ±this
ADAPTIVE_KL_ERROR_CLIP = 0.2


class KLController(Protocol):
    """Holds the current KL coefficient ``value`` (β) and updates it after each step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """β stays ``kl_coef``; ``update`` leaves it unchanged."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """A fixed coefficient does not react to the observed KL (by definition, not a placeholder)."""
        return None


class AdaptiveKLController:
    """β ← β·(1 + clip(KL/target − 1, ±0.2)·n_steps/horizon) (arXiv:1909.08593, eq. 2).

    Example (KL below target lowers β):
        >>> ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
        >>> ctrl.update(current_kl=0.04, n_steps=100)
        >>> round(ctrl.value, 6)
        0.098
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if not horizon > 0:
            raise ValueError(
                f"adaptive KL controller needs horizon > 0 (kl_ctrl.horizon), got {horizon}"
            )
        if not target_kl > 0:
            raise ValueError(
                f"adaptive KL controller needs target_kl > 0 (kl_ctrl.target_kl), got {target_kl}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = current_kl / self.target - 1.0
        error = min(max(error, -ADAPTIVE_KL_ERROR_CLIP), ADAPTIVE_KL_ERROR_CLIP)
        self.value *= 1.0 + error * n_steps / self.horizon


@dataclass(frozen=True)
class KLControllerSpec:
    """One ``KL_CONTROLLERS`` entry (``algorithm.kl_ctrl.type``).

    Attributes:
        fn: ``kl_ctrl`` section (object or mapping) → the controller.
        positive: the ``kl_ctrl`` fields it needs > 0 (the config checks them before the run).
        adapts: β moves after each step with that step's KL (a schedule that draws a step's
            input before the previous step ends cannot give it the β it would have).
    """

    fn: Callable[[Any], KLController]
    positive: tuple[str, ...] = ()
    adapts: bool = False


KL_CONTROLLERS: Registry[KLControllerSpec] = Registry("KL controller type")


def register_kl_controller(
    name: str, *, positive: tuple[str, ...] = (), adapts: bool = False
) -> Callable[[Callable[[Any], KLController]], Callable[[Any], KLController]]:
    """Decorator adding ``fn(kl_ctrl) -> KLController`` under ``name`` with the fields it needs
    > 0 and whether β adapts (:class:`KLControllerSpec`); the function is returned unchanged."""

    def add(fn: Callable[[Any], KLController]) -> Callable[[Any], KLController]:
        KL_CONTROLLERS.add(name, KLControllerSpec(fn=fn, positive=positive, adapts=adapts))
        return fn

    return add


@register_kl_controller("fixed")
def _fixed_from_config(kl_ctrl: Any) -> KLController:
    return FixedKLController(kl_coef=read_field(kl_ctrl, "kl_coef"))


@register_kl_controller("adaptive", positive=("horizon", "target_kl"), adapts=True)
def _adaptive_from_config(kl_ctrl: Any) -> KLController:
    return AdaptiveKLController(
        init_kl_coef=read_field(kl_ctrl, "kl_coef"),
        target_kl=read_field(kl_ctrl, "target_kl"),
        horizon=read_field(kl_ctrl, "horizon"),
    )


def get_kl_controller(kl_ctrl: Any) -> KLController:
    """A controller from ``algorithm.kl_ctrl`` (``type``: fixed | adaptive, ``kl_coef``, ``target_kl``,
    ``horizon``); an object with those attributes or a Mapping. Unknown types raise ``KeyError``.

    Example:
        >>> get_kl_controller({"type": "fixed", "kl_coef": 0.01}).value
        0.01
    """
    return KL_CONTROLLERS.get(read_field(kl_ctrl, "type")).fn(kl_ctrl)


def kl_penalized_rewards(
    token_level_scores: Tensor,
    old_log_probs: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    beta: float,
    kl_penalty: str = "kl",
) -> tuple[Tensor, Tensor]:
    """token_level_rewards = scores − β·kld with kld = kl_penalty(old, ref)·mask.

    Args:
        token_level_scores: (B, R) reward-stage scores.
        old_log_probs, ref_log_prob: (B, R) token log-probs under the rollout and reference policies.
        response_mask: (B, R) 1 on response tokens.
        beta: KL coefficient β. kl_penalty: estimator name (:mod:`stages.algos.kl`).

    Returns:
        ``(token_level_rewards (B, R), current_kl 0-d)``; current_kl = mean over rows of each row's
        masked mean of kld (an empty row contributes 0).

    Example (d = old − ref = 0.5 on the first token only):
        >>> import torch
        >>> rewards, kl = kl_penalized_rewards(torch.tensor([[0., 1.]]), torch.tensor([[0., 0.]]),
        ...                                    torch.tensor([[-.5, 0.]]), torch.ones(1, 2), beta=0.1)
        >>> rewards, kl
        (tensor([[-0.0500,  1.0000]]), tensor(0.2500))
    """
    kld = kl_estimate(old_log_probs, ref_log_prob, kl_penalty) * response_mask  # (B, R)
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean()  # per-row mean, then batch mean
    return token_level_rewards, current_kl


def kl_in_reward(
    data: DataProto, kl_ctrl: KLController, kl_penalty: str = "kl"
) -> tuple[DataProto, dict[str, float]]:
    """Apply the KL penalty to ``data`` and step the controller; ``data`` is not modified.

    Uses β *before* the update, then calls ``kl_ctrl.update(current_kl, n_steps=B)``.

    Returns:
        ``(delta, metrics)``: a DataProto with only ``token_level_rewards`` (B, R), and
        ``{"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": β}`` as floats.
    """
    tensors = data.batch
    if tensors is None:
        raise ValueError("KL-in-reward needs a tensor batch, but batch.batch is None")
    needed = (keys.TOKEN_LEVEL_SCORES, keys.OLD_LOG_PROBS, keys.REF_LOG_PROB, keys.RESPONSE_MASK)
    missing = [key for key in needed if key not in tensors]
    if missing:
        raise KeyError(
            f"KL-in-reward needs batch keys {missing} (have {sorted(tensors.keys())}); "
            "ref_log_prob comes from the reference policy stage, old_log_probs from old_log_prob"
        )
    beta = kl_ctrl.value
    rewards, current_kl = kl_penalized_rewards(
        *(tensors[key] for key in needed), beta=beta, kl_penalty=kl_penalty
    )
    current_kl = float(current_kl)  # host boundary: the controller state lives on the host
    kl_ctrl.update(current_kl=current_kl, n_steps=rewards.shape[0])
    delta = TensorDict(
        {keys.TOKEN_LEVEL_REWARDS: rewards}, batch_size=[rewards.shape[0]], device=rewards.device
    )
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
    return DataProto(batch=delta, non_tensor_batch={}, meta_info={}), metrics


def apply_kl_penalty(
    data: DataProto, kl_ctrl: KLController, kl_penalty: str = "kl"
) -> tuple[DataProto, dict[str, float]]:
    """verl's ``apply_kl_penalty``: :func:`kl_in_reward`, written into ``data.batch`` in place.

    Returns ``(data, metrics)`` like verl; ppoflow stages use :func:`kl_in_reward` instead.
    """
    delta, metrics = kl_in_reward(data, kl_ctrl, kl_penalty)
    data.batch[keys.TOKEN_LEVEL_REWARDS] = delta.batch[keys.TOKEN_LEVEL_REWARDS]
    return data, metrics
