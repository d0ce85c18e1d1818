"""The critic worker: values of a rollout batch, and the clipped value-function update.

The value of the state before response token t is the head's output at position t − 1 of the full
sequence (verl's ``values[:, -R - 1 : -1]``), so for a (B, T = P + R) sequence the R values use the
hidden states at positions P − 1 … T − 2. Both functions take and return DataProto batches and hold
no orchestration state; the model is a :class:`ValueModel`, or the DeepSpeed engine wrapping one
(every forward goes through ``engine(...)`` so ZeRO-3 gathers the parameters around it).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict
from torch import Tensor, nn

from dataproto import DataProto, keys
from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.masked import masked_mean
from stages.algos.micro_batch import restore_order
from stages.algos.policy_loss_config import read_settings
from stages.algos.value_loss import compute_value_loss
from stages.engines.batching import MicroBatching
from stages.engines.ppo_update import PPOUpdateSettings, ppo_update, take_rows
from stages.engines.response_hidden import response_hidden_states
from stages.engines.trimming import pad_response_columns
from stages.metrics.metric import Metric

if TYPE_CHECKING:
    from stages.config.schema_critic import CriticConfig

#: the head attribute names of Hugging Face ``*ForTokenClassification`` models
_HEAD_NAMES = ("score", "classifier")

#: batch keys a forward pass reads
FORWARD_KEYS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)
#: batch keys the update reads besides the forward keys
UPDATE_KEYS = (keys.RESPONSE_MASK, keys.VALUES, keys.RETURNS)
#: critic metrics whose micro-batch values are partial sums under global denominators
SUMMED_LOSS_METRICS = frozenset({"critic/vf_loss"})


@dataclass(frozen=True)
class ValueLossSettings:
    """The critic loss settings (verl's critic.* names; no defaults here).

    cliprange_value: c, v_pred stays within v_old ± c (value units).
    loss_agg_mode: aggregation of the token losses (``stages.algos.aggregation``).
    """

    cliprange_value: float
    loss_agg_mode: str

    @classmethod
    def from_critic(cls, critic: CriticConfig) -> ValueLossSettings:
        """The settings of a filled ``critic`` slice (``loss_agg_mode`` inherited, not null)."""
        if critic.loss_agg_mode is None:
            raise ValueError(
                "critic.loss_agg_mode is null (inherit the actor's): read the critic slice of a "
                "validated PPORunConfig, which fills it in"
            )
        return cls(cliprange_value=critic.cliprange_value, loss_agg_mode=critic.loss_agg_mode)

    @classmethod
    def resolve(cls, config: Any) -> ValueLossSettings:
        """A typed critic slice is read whole; a verl-style config (mapping, object, None) gives
        the fields it holds, the schema's defaults (a default run's filled critic) the rest."""
        from stages.config.schema_critic import CriticConfig

        if isinstance(config, ValueLossSettings):
            return config
        if isinstance(config, CriticConfig):
            return cls.from_critic(config)
        return dataclasses.replace(
            cls.from_critic(_default_critic()), **read_settings(config, ValueLossSettings)
        )


@functools.cache
def _default_critic() -> CriticConfig:
    """The default run's critic slice, its null keys filled from the actor's defaults."""
    from stages.config.root import PPORunConfig

    return PPORunConfig().critic


def value_head(model: nn.Module) -> nn.Module:
    """The one-output head of a Hugging Face token-classification model (``score`` or ``classifier``)."""
    for name in _HEAD_NAMES:
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    raise TypeError(
        f"{type(model).__name__} has no value head attribute (looked for {list(_HEAD_NAMES)}); "
        "load the critic with stages.engines.models.load_value_model"
    )


class ValueModel(nn.Module):
    """A token-classification model whose ``forward`` returns the (B, R) response values.

    ``backbone`` is the whole Hugging Face ``*ForTokenClassification`` model (base model + one-output
    head, what :func:`~stages.engines.models.load_value_model` returns, and what is exported). The
    head's dropout is skipped (verl sets ``classifier_dropout = 0`` for the critic), so the values do
    not depend on train/eval mode; only the R response-aligned hidden states go through the head.
    """

    def __init__(self, backbone: nn.Module, layout: str = "trimmed") -> None:
        super().__init__()
        num_labels = getattr(getattr(backbone, "config", None), "num_labels", None)
        if num_labels != 1:
            raise ValueError(
                f"the critic backbone must have exactly one output label (a scalar value), got "
                f"num_labels={num_labels!r}; load it with load_value_model (num_labels=1)"
            )
        value_head(backbone)  # fail early on a model without a head
        self.backbone = backbone
        self.layout = layout

    @property
    def hf_model(self) -> nn.Module:
        """The Hugging Face model: ``backbone`` itself, or under LoRA adapters the model PEFT
        wraps (its layers adapted, its value head the trained copy)."""
        get_base = getattr(self.backbone, "get_base_model", None)
        return get_base() if callable(get_base) else self.backbone

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, response_length: int
    ) -> Tensor:
        """(B, T) inputs → (B, R) float32 values V(s_t) for the R response positions; the forward
        runs in ``layout`` (``stages.engines.response_hidden``), and response columns it did not
        compute (padding in every row; packed: after a row's last real token) get 0."""
        model = self.hf_model
        hidden, real = response_hidden_states(
            model.base_model, input_ids, attention_mask, position_ids, response_length, self.layout
        )  # (B, R', H)
        values = value_head(model)(hidden).squeeze(-1).float()  # (B, R')
        if real is not None:
            values = values.where(real, 0.0)
        return pad_response_columns(values, response_length)  # (B, R)


def require_keys(tensors: TensorDict, needed: Iterable[str], where: str) -> None:
    """KeyError naming the first key of ``needed`` missing from the batch's tensor layer."""
    present = set(tensors.keys())
    for key in needed:
        if key not in present:
            raise KeyError(
                f"{where} needs the batch key {key!r}, which is missing; the batch has "
                f"{sorted(present)}"
            )


def _forward_values(model, batch: TensorDict) -> Tensor:
    """``model``: a :class:`ValueModel`, or the DeepSpeed engine wrapping one."""
    return model(
        batch[keys.INPUT_IDS],
        batch[keys.ATTENTION_MASK],
        batch[keys.POSITION_IDS],
        batch[keys.RESPONSES].shape[1],
    )


@torch.no_grad()
def compute_values(model, batch: DataProto, micro: MicroBatching) -> DataProto:
    """(B, R) values of the responses, micro-batched, in the batch's original row order.

    Returns a delta DataProto with ``values`` (float32; entries at response padding are computed
    like any other and masked by the callers with ``response_mask``).
    """
    tensors = batch.batch
    require_keys(tensors, FORWARD_KEYS, "compute_values")
    plan = micro.plan(tensors[keys.ATTENTION_MASK])
    values = restore_order([_forward_values(model, take_rows(tensors, idx)) for idx in plan], plan)
    return DataProto(
        batch=TensorDict({keys.VALUES: values}, batch_size=[len(values)]), meta_info={}
    )


def update_critic(
    engine, batch: DataProto, settings: PPOUpdateSettings, loss_config: Any
) -> dict[str, Metric]:
    """The clipped value update: ``epochs`` × mini-batches, one optimizer step each
    (``ppo_update``).

    loss_config: ``cliprange_value`` and ``loss_agg_mode``: the filled critic slice, a
    :class:`ValueLossSettings`, or a verl-style mapping (absent fields take the schema's
    defaults). Each micro-batch's loss
    (``compute_value_loss``: ½·agg(max((v−R)², (v_clip−R)²)) under the mini-batch's global
    denominators) is a partial sum, so gradients accumulate unscaled and the step follows the last
    micro-batch. Metrics per optimizer step, then averaged over steps: ``critic/vf_loss`` (summed
    over micro-batches = the mini-batch loss), ``critic/vf_clipfrac`` and ``critic/vpred_mean``
    (means over micro-batches), ``critic/grad_norm`` and ``critic/lr``.
    """
    tensors = batch.batch
    require_keys(tensors, FORWARD_KEYS + UPDATE_KEYS, "update_critic")
    micro_loss = functools.partial(
        critic_micro_loss, loss_settings=ValueLossSettings.resolve(loss_config)
    )
    return ppo_update(
        engine, tensors, settings, micro_loss, prefix="critic", summed=SUMMED_LOSS_METRICS
    )


def critic_micro_loss(
    engine, micro: TensorDict, info: GlobalBatchInfo, *, loss_settings: ValueLossSettings
) -> tuple[Tensor, dict[str, Tensor]]:
    """The value loss of one micro-batch of b rows (``compute_value_loss`` under ``info``): the
    (b, R) values through ``engine`` against ``returns`` and the old ``values`` under
    ``response_mask``; metrics ``critic/vf_loss`` (this partial), ``critic/vf_clipfrac`` and
    ``critic/vpred_mean`` (masked mean of the values)."""
    vpreds = _forward_values(engine, micro)  # (b, R)
    mask = micro[keys.RESPONSE_MASK]
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds,
        micro[keys.RETURNS],
        micro[keys.VALUES],
        mask,
        loss_settings.cliprange_value,
        loss_settings.loss_agg_mode,
        **info.as_kwargs(),
    )
    return vf_loss, {
        "critic/vf_loss": vf_loss.detach(),
        "critic/vf_clipfrac": vf_clipfrac,
        "critic/vpred_mean": masked_mean(vpreds.detach(), mask),
    }
