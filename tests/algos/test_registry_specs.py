"""The policy-loss and KL-estimator registries: each entry's declared needs hold."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stages.algos.aggregation import AGG_LOSS_MODES, GlobalBatchInfo, aggregate_loss
from stages.algos.defaults import KL_CTRL_DEFAULTS
from stages.algos.kl import (
    KL_ESTIMATORS,
    KLEstimatorSpec,
    kl_penalty,
    kl_penalty_names,
    register_kl_estimator,
    unavailable_kl_penalties,
)
from stages.algos.kl_control import KL_CONTROLLERS, get_kl_controller
from stages.algos.policy_loss_config import (
    POLICY_LOSSES,
    PolicyLossSettings,
    PolicyLossSpec,
    register_policy_loss,
    resolve_policy_loss_config,
)
from stages.config.schema_actor import ActorConfig

#: the settings every loss may read whatever it declares (the aggregation and its denominators)
COMMON = {"loss_agg_mode", "loss_mode", "global_batch_info"}


class _RecordingSettings(PolicyLossSettings):
    """PolicyLossSettings that records which fields a loss reads."""

    def __getattribute__(self, name: str):
        if not name.startswith("_") and name in _FIELDS:
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return object.__getattribute__(self, name)


_FIELDS = {f.name for f in dataclasses.fields(PolicyLossSettings)}


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_each_loss_reads_exactly_what_it_declares(name: str) -> None:
    spec = POLICY_LOSSES.get(name)
    assert isinstance(spec, PolicyLossSpec)
    base = PolicyLossSettings.from_actor(ActorConfig())
    settings = _RecordingSettings(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    )
    generator = torch.Generator().manual_seed(0)
    old, log_prob = -torch.rand(2, 3, generator=generator), -torch.rand(2, 3, generator=generator)
    advantages = torch.randn(2, 3, generator=generator)
    spec.fn(old, log_prob, advantages, torch.ones(2, 3), "token-mean", settings)
    read = settings.__dict__.get("_read", set()) - COMMON
    assert read == set(spec.reads), f"{name} reads {sorted(read)}, declares {sorted(spec.reads)}"


def test_register_policy_loss_checks_the_declared_fields() -> None:
    with pytest.raises(ValueError, match=r"reads \['clip_ration'\].*not PolicyLossSettings"):
        register_policy_loss("test_typo", reads=("clip_ration",))
    assert "test_typo" not in POLICY_LOSSES


def test_a_registered_loss_is_a_spec_and_its_function_is_returned() -> None:
    def mine(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
             config=None, rollout_is_weights=None, global_batch_info=None, generator=None):  # fmt: skip
        return (log_prob * 0).sum(), {}

    try:
        assert register_policy_loss("test_mine", reads=("clip_ratio_c",))(mine) is mine
        assert POLICY_LOSSES.get("test_mine") == PolicyLossSpec(mine, frozenset({"clip_ratio_c"}))
    finally:
        POLICY_LOSSES.remove("test_mine")


def test_clip_ratio_alone_moves_both_sides_in_the_verl_reader() -> None:
    settings = resolve_policy_loss_config({"clip_ratio": 0.3})
    assert (settings.clip_low, settings.clip_high) == (0.3, 0.3)
    settings = resolve_policy_loss_config({"clip_ratio": 0.3, "clip_ratio_high": 0.28})
    assert (settings.clip_low, settings.clip_high) == (0.3, 0.28)


# --- KL estimators -----------------------------------------------------------------------------


def test_full_is_registered_as_needing_the_full_distribution() -> None:
    spec = KL_ESTIMATORS.get("full")
    assert spec.needs_full_distribution and spec.fn is None
    assert "full" not in kl_penalty_names() and "full+" not in kl_penalty_names()
    assert "full" in unavailable_kl_penalties()
    with pytest.raises(NotImplementedError, match="'full' is not supported"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full+")


def test_every_token_estimator_entry_evaluates() -> None:
    d = torch.tensor([[0.5, -0.25]])
    for name in kl_penalty_names():
        assert kl_penalty(d, torch.zeros_like(d), name).shape == (1, 2), name


def test_a_registered_kl_estimator_is_usable_with_its_straight_through_variant() -> None:
    def cube(d: torch.Tensor) -> torch.Tensor:
        return d**3

    try:
        register_kl_estimator("test_cube")(cube)
        assert {"test_cube", "test_cube+"} <= set(kl_penalty_names())
        logp = torch.tensor([[0.5]], requires_grad=True)
        value = kl_penalty(logp, torch.zeros(1, 1), "test_cube+")
        value.sum().backward()
        assert (value.item(), logp.grad.item()) == (0.125, 0.5)  # value of d³, gradient of k2
    finally:
        KL_ESTIMATORS.remove("test_cube")


def test_a_spec_without_function_must_need_the_full_distribution() -> None:
    with pytest.raises(ValueError, match="fn=None exactly when"):
        KLEstimatorSpec(fn=None)


@pytest.mark.parametrize("name", KL_CONTROLLERS.names())
def test_each_kl_controller_refuses_exactly_the_fields_it_declares_positive(name: str) -> None:
    numeric = [field for field, value in KL_CTRL_DEFAULTS.items() if field != "type"]
    refused = set()
    for field in numeric:
        try:
            get_kl_controller({**KL_CTRL_DEFAULTS, "type": name, field: 0})
        except ValueError:
            refused.add(field)
    assert refused == set(KL_CONTROLLERS.get(name).positive), name
    assert (
        get_kl_controller({**KL_CTRL_DEFAULTS, "type": name}).value == KL_CTRL_DEFAULTS["kl_coef"]
    )


@pytest.mark.parametrize("mode", AGG_LOSS_MODES.names())
def test_each_aggregation_reads_the_scale_factor_exactly_when_it_declares_so(mode: str) -> None:
    loss, mask = (
        torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]]),
        torch.tensor([[1, 1, 1], [1, 1, 0]]),
    )
    plain = aggregate_loss(loss, mask, mode, GlobalBatchInfo())
    scaled = aggregate_loss(loss, mask, mode, GlobalBatchInfo(loss_scale_factor=7.0))
    assert bool(plain != scaled) == AGG_LOSS_MODES.get(mode).reads_loss_scale_factor, mode
