"""The weight-sync probe (stages/engines/weight_probe.py): the sent side's copies against an
engine's digests — a faithful copy passes in any dtype, a stale one is named."""

from __future__ import annotations

import math

import torch

from stages.engines.weight_probe import (
    MISMATCHED,
    PROBED,
    SyncProbe,
    engine_digests,
    is_probed,
)


def sent_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(8, 4),
        "model.layers.0.input_layernorm.weight": torch.randn(4),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4),
        "model.norm.weight": torch.randn(4),
    }


def test_the_stream_passes_through_and_only_the_norm_weights_are_kept():
    probe = SyncProbe()
    weights = sent_weights()
    passed = list(probe.tee(weights.items()))
    assert [name for name, _ in passed] == list(weights)
    assert all(tensor is weights[name] for name, tensor in passed)  # no copy on the way
    assert sorted(probe.sent) == ["model.layers.0.input_layernorm.weight", "model.norm.weight"]
    assert [is_probed(name) for name in weights] == [False, True, False, True]


def test_an_engine_holding_the_sent_weights_in_bf16_passes():
    probe = SyncProbe()
    weights = sent_weights()
    list(probe.tee(weights.items()))
    engine = {name: tensor.to(torch.bfloat16) for name, tensor in weights.items()}
    answers = [
        engine_digests(engine.items(), probe.sent),
        engine_digests(engine.items(), probe.sent),
    ]
    check = probe.compare(answers)  # two workers (tensor parallel): both hold the norms
    assert check.probed == 4 and check.mismatched == ()
    assert check.metrics() == {PROBED: 4.0, MISMATCHED: 0.0}


def test_an_engine_that_kept_its_old_weights_is_named():
    probe = SyncProbe()
    old = sent_weights()
    new = {name: tensor + 0.01 for name, tensor in old.items()}  # the update moved every weight
    list(probe.tee(new.items()))
    check = probe.compare([engine_digests(old.items(), probe.sent)])  # the sync did nothing
    assert check.mismatched == ("model.layers.0.input_layernorm.weight", "model.norm.weight")
    assert check.metrics()[MISMATCHED] == 2.0


def test_a_shard_is_not_compared_and_nothing_probed_is_nan():
    probe = SyncProbe()
    list(probe.tee(sent_weights().items()))
    shard = {"model.norm.weight": torch.zeros(2)}  # another shape: not this tensor's copy
    check = probe.compare([engine_digests(shard.items(), probe.sent)])
    assert check.probed == 0 and math.isnan(check.metrics()[MISMATCHED])
