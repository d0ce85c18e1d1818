"""Engine settings: validation, the DeepSpeed config, the lr schedule, offload and bf16 paths."""

from __future__ import annotations

import math

import pytest
import torch

from stages.engines.deepspeed_setup import (
    EngineSettings,
    deepspeed_config,
    initialize_engine,
    lr_lambda,
    step_lr_schedule,
)
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm


def test_constant_schedule_with_linear_warmup():
    multiplier = lr_lambda(EngineSettings(warmup_steps=3, total_steps=10))
    assert [multiplier(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_schedule_reaches_its_floor():
    settings = EngineSettings(
        lr_scheduler="cosine", warmup_steps=2, total_steps=12, min_lr_ratio=0.1
    )
    multiplier = lr_lambda(settings)
    assert multiplier(2) == pytest.approx(1.0)
    assert multiplier(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert multiplier(12) == pytest.approx(0.1)
    assert multiplier(40) == pytest.approx(0.1)


def _verl_cosine(step: int, warmup: int, total: int, floor: float, num_cycles: float) -> float:
    """verl's get_cosine_schedule_with_warmup lr_lambda after warm-up (torch_functional.py)."""
    progress = (step - warmup) / max(1, total - warmup)
    x = math.cos(math.pi * num_cycles * 2.0 * progress)
    return max(floor, x * (1 - floor) * 0.5 + (1 + floor) * 0.5)


@pytest.mark.parametrize("num_cycles", [0.5, 1.0, 1.5, 0.25])
def test_cosine_num_cycles_follows_verl(num_cycles):
    """One full cycle (1.0) returns to the peak at the end; 1.5 ends at the floor; the default
    0.5 is the half-cosine decay. Worked value: num_cycles=1, floor 0, halfway → cos(π) → 0."""
    settings = EngineSettings(
        lr_scheduler="cosine",
        warmup_steps=2,
        total_steps=10,
        min_lr_ratio=0.2,
        num_cycles=num_cycles,
    )
    multiplier = lr_lambda(settings)
    for step in range(2, 11):
        assert multiplier(step) == pytest.approx(_verl_cosine(step, 2, 10, 0.2, num_cycles))
    full = lr_lambda(EngineSettings(lr_scheduler="cosine", total_steps=10, num_cycles=1.0))
    assert (full(0), full(5), full(10)) == pytest.approx((1.0, 0.0, 1.0))


def test_num_cycles_reaches_the_engine_settings():
    from stages.config import load_config
    from stages.engines.roles import engine_settings

    cfg = load_config(
        None, ["actor_rollout_ref.actor.optim.num_cycles=1.5", "critic.optim.num_cycles=2.0"]
    )
    actor = cfg.actor_rollout_ref.actor
    assert engine_settings(actor, actor.optim, "float32", 10).num_cycles == 1.5
    assert engine_settings(cfg.critic, cfg.critic.optim, "float32", 10).num_cycles == 2.0
    with pytest.raises(ValueError, match="num_cycles"):
        EngineSettings(num_cycles=0.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zero_stage": 4}, "zero_stage"),
        ({"dtype": "fp16"}, "dtype"),
        ({"lr_scheduler": "linear"}, "lr_scheduler"),
        ({"offload_optimizer": True}, "offload"),
        ({"zero_stage": 2, "offload_param": True}, "offload_param"),
    ],
)
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineSettings(**kwargs)


def test_deepspeed_config_reflects_the_settings():
    config = deepspeed_config(
        EngineSettings(
            zero_stage=3, dtype="bf16", offload_optimizer=True, offload_param=True, clip_grad=0.5
        ),
        micro_batch_size=2,
        world_size=4,
    )
    assert config["train_batch_size"] == 8 and config["gradient_accumulation_steps"] == 1
    assert config["bf16"] == {"enabled": True} and config["gradient_clipping"] == 0.5
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu"


def test_schedule_steps_once_per_training_step(tiny_model_dir):
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(tiny_model_dir)),
        EngineSettings(lr=1e-3, warmup_steps=1, total_steps=4),
    )
    assert engine.get_lr()[0] == pytest.approx(0.5e-3)
    step_lr_schedule(engine)
    assert engine.get_lr()[0] == pytest.approx(1e-3)


def test_bf16_engine_computes_float32_logprobs(tiny_model_dir, make_rollout_batch):
    from stages.engines.actor import compute_log_prob
    from stages.engines.batching import MicroBatching

    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(tiny_model_dir)),
        EngineSettings(zero_stage=2, dtype="bf16"),
    )
    batch = make_rollout_batch([2, 3], [3, 1], P=3, R=3)
    delta, _ = compute_log_prob(engine, batch, MicroBatching())
    logprobs = delta.batch["old_log_probs"]
    assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()
    assert next(engine.module.parameters()).dtype == torch.bfloat16


@pytest.mark.slow
def test_optimizer_offload_trains_like_no_offload(tiny_model_dir, make_rollout_batch):
    """ZeRO-2 with the optimizer offloaded to DeepSpeed's CPU Adam (compiled on first use)."""
    from stages.engines.actor import PPOUpdateSettings, update_actor

    batch = make_rollout_batch([3, 2, 4, 1], [3, 2, 1, 3], P=4, R=3, seed=4)
    weights = []
    for offload in (False, True):
        torch.manual_seed(0)
        engine = initialize_engine(
            ResponseLogProbModel(load_causal_lm(tiny_model_dir)),
            EngineSettings(zero_stage=2, lr=1e-2, eps=1e-3, offload_optimizer=offload),
        )
        update_actor(
            engine, batch, PPOUpdateSettings(mini_batch_size=4), {"loss_agg_mode": "token-mean"}
        )
        weights.append({n: p.detach().clone() for n, p in engine.module.named_parameters()})
    for name in weights[0]:
        torch.testing.assert_close(
            weights[1][name], weights[0][name], atol=1e-5, rtol=1e-4, msg=name
        )


def test_frozen_zero3_reference_with_param_offload_computes_the_same_logprobs(
    tiny_model_dir, make_rollout_batch
):
    """actor_rollout_ref.ref.param_offload: the frozen ZeRO-3 engine keeps its parameters in CPU
    memory (offload_param in its DeepSpeed config) and computes the same log-probs."""
    from stages.config import load_config
    from stages.engines.actor import compute_log_prob
    from stages.engines.batching import MicroBatching
    from stages.engines.roles import reference_settings

    cfg = load_config(
        None,
        ["actor_rollout_ref.ref.zero_stage=3", "actor_rollout_ref.ref.param_offload=true"],
    )
    settings = reference_settings(cfg.actor_rollout_ref.ref, "float32")
    assert (settings.zero_stage, settings.offload_param) == (3, True)
    batch = make_rollout_batch([2, 3], [3, 1], P=3, R=3)
    logprobs = []
    for offload in (False, True):
        engine = initialize_engine(
            ResponseLogProbModel(load_causal_lm(tiny_model_dir)),
            EngineSettings(zero_stage=3, offload_param=offload),
            trainable=False,
        )
        zero = engine.config["zero_optimization"]
        assert ("offload_param" in zero) is offload
        delta, _ = compute_log_prob(engine, batch, MicroBatching())
        logprobs.append(delta.batch["old_log_probs"])
    torch.testing.assert_close(logprobs[1], logprobs[0])


ARCH_LISTS = [
    "9.0",
    "8.0 9.0+PTX",
    "7.5;8.0+PTX",
    " 8.6 ;9.0 ",
    "9.0a",
    "8.0;9.0a;10.0",
    "9",
    "10.0f",
]


@pytest.mark.parametrize("arch_list", ARCH_LISTS)
def test_cuda_arch_check_accepts_what_deepspeeds_jit_builder_reads(arch_list, monkeypatch):
    """The check refuses exactly the TORCH_CUDA_ARCH_LIST values on which DeepSpeed's own CUDA op
    builder (the one FusedAdam's JIT build runs) fails; the refusal is one line naming the bad
    entries."""
    import importlib

    from stages.engines.deepspeed_setup import check_cuda_arch_list

    builder = importlib.import_module("deepspeed.ops.op_builder.fused_adam").FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)  # DeepSpeed rewrites it; restored after
    try:
        builder.compute_capability_args()
        deepspeed_reads_it = True
    except ValueError:
        deepspeed_reads_it = False
    if deepspeed_reads_it:
        check_cuda_arch_list(arch_list)
    else:
        with pytest.raises(ValueError, match=r"TORCH_CUDA_ARCH_LIST=.*such as '9\.0'") as refused:
            check_cuda_arch_list(arch_list)
        message = str(refused.value)
        assert "\n" not in message and "'10.0'" not in message and "'8.0'" not in message
        assert ("9.0a" in message) or ("'9'" in message) or ("10.0f" in message)
