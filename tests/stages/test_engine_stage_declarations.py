"""The five stages that call a model on the step batch: their declarations, pinned key by key, and
the engine role and method each one calls."""

from __future__ import annotations

import pytest
import torch

from dataproto import DataProto
from flows.dag import skip_reason
from stages.old_log_prob import OLD_LOG_PROB_STAGE
from stages.ref_log_prob import REF_LOG_PROB_STAGE
from stages.stage import StageContext
from stages.update_actor import UPDATE_ACTOR_STAGE
from stages.update_critic import UPDATE_CRITIC_STAGE
from stages.values import VALUES_STAGE

SEQUENCE = [
    "batch.input_ids",
    "batch.attention_mask",
    "batch.position_ids",
    "batch.responses",
]

#: stage → (requires, produces, optional, config_keys, condition, reads, writes, engine)
DECLARATIONS = {
    "old_log_prob": (
        [*SEQUENCE, "batch.response_mask", "batch.rollout_log_probs", "meta_info.temperature"],
        ["batch.old_log_probs"],
        [],
        (
            "algorithm.rollout_correction.bypass_mode",
            "actor_rollout_ref.actor.loss_agg_mode",
            "actor_rollout_ref.actor.loss_scale_factor",
        ),
        "disabled: when(config) is False",
        True,
        False,
        "actor",
    ),
    "ref_log_prob": (
        [*SEQUENCE, "meta_info.temperature"],
        ["batch.ref_log_prob"],
        [],
        (),
        "disabled: uses_reference_policy(config) is False",
        True,
        False,
        "ref",
    ),
    "values": (
        SEQUENCE,
        ["batch.values"],
        [],
        (),
        "disabled: uses_critic(config) is False",
        True,
        False,
        "critic",
    ),
    "update_critic": (
        [*SEQUENCE, "batch.response_mask", "batch.values", "batch.returns"],
        [],
        ["batch.rollout_rs_mask"],
        ("critic",),
        "disabled: uses_critic(config) is False",
        True,
        True,
        "critic",
    ),
    "update_actor": (
        [
            *SEQUENCE,
            "batch.response_mask",
            "batch.old_log_probs",
            "batch.advantages",
            "meta_info.temperature",
        ],
        [],
        ["batch.ref_log_prob", "batch.rollout_is_weights", "batch.rollout_rs_mask"],
        ("actor_rollout_ref.actor", "algorithm.rollout_correction"),
        "disabled: after_critic_warmup(config, step) is False",
        True,
        True,
        "actor",
    ),
}

#: stage → the tensors its delta keeps beyond ``produces`` when it calls its engine (declared by
#: ``extra_outputs``): old_log_prob's per-token entropy, for the sample page
KEPT_BEYOND_PRODUCES = {"old_log_prob": ["entropys"]}

STAGES = {
    stage.name: stage
    for stage in (
        OLD_LOG_PROB_STAGE,
        REF_LOG_PROB_STAGE,
        VALUES_STAGE,
        UPDATE_CRITIC_STAGE,
        UPDATE_ACTOR_STAGE,
    )
}

MODULES = {
    "old_log_prob": "stages.old_log_prob",
    "ref_log_prob": "stages.ref_log_prob",
    "values": "stages.values",
    "update_critic": "stages.update_critic",
    "update_actor": "stages.update_actor",
}


def test_the_five_stages_are_pinned():
    assert sorted(STAGES) == sorted(DECLARATIONS) == sorted(MODULES) == sorted(CALLS)


@pytest.mark.parametrize("name", list(DECLARATIONS))
def test_declaration_is_pinned(name):
    stage = STAGES[name]
    requires, produces, optional, config_keys, reason, reads, writes, engine = DECLARATIONS[name]
    assert [str(ref) for ref in stage.requires] == requires
    assert [str(ref) for ref in stage.produces] == produces
    assert [str(ref) for ref in stage.optional] == optional
    assert stage.config_keys == config_keys
    assert skip_reason(stage) == reason
    assert (stage.reads_weights, stage.writes_weights, stage.engine) == (reads, writes, engine)
    assert stage.version == (2 if name in KEPT_BEYOND_PRODUCES else 1)
    extra = ("batch",) if name in KEPT_BEYOND_PRODUCES else ()
    assert (stage.file_keys, stage.seeded, stage.extra_outputs) == ((), False, extra)
    assert (stage.reorders, dict(stage.derived)) == (None, {})


@pytest.mark.parametrize("name", list(MODULES))
def test_stage_function_lives_in_its_own_module(name):
    """The code fingerprint starts from the module defining ``fn``: it must be the stage's own,
    so an edit of the stage module changes the stage's cache key."""
    assert STAGES[name].fn.__module__ == MODULES[name]


def _output(**tensors) -> DataProto:
    out = DataProto.from_dict(tensors or None)
    out.meta_info["metrics"] = {"engine/loss": [1.0, 3.0]}
    return out


#: stage → (role, method, what the engine returns): the one model call each stage makes
CALLS = {
    "old_log_prob": (
        "actor",
        "compute_log_prob",
        lambda: _output(old_log_probs=torch.zeros(4, 3), entropys=torch.ones(4, 3)),
    ),
    "ref_log_prob": (
        "ref",
        "compute_ref_log_prob",
        lambda: _output(ref_log_prob=torch.ones(4, 3)),
    ),
    "values": ("critic", "compute_values", lambda: _output(values=torch.ones(4, 3))),
    "update_critic": ("critic", "update_critic", _output),
    "update_actor": ("actor", "update_actor", _output),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_stage_calls_its_engine_once_and_keeps_only_what_it_produces(
    name, fake_engine, rollout_batch, make_config
):
    stage = STAGES[name]
    role, method, output = CALLS[name]
    engine = fake_engine(**{method: lambda batch: output()})
    cfg = make_config("algorithm.rollout_correction.bypass_mode=false")
    ctx = StageContext(cfg, {role: engine})
    delta = stage.fn(rollout_batch, ctx)
    assert [call[0] for call in engine.calls] == [method]
    held = sorted(delta.batch.keys()) if delta.batch is not None else []
    kept = [ref.name for ref in stage.produces] + KEPT_BEYOND_PRODUCES.get(name, [])
    assert held == sorted(kept)
    assert ctx.metrics["engine/loss"] == 2.0  # the engine's metrics, reduced, in ctx.metrics
