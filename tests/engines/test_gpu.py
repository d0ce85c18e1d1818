"""The engines on CUDA: DeepSpeed bf16 / ZeRO-3 updates, bf16 log-probs, HF rollouts, and the
micro-batch split invariance of the PPO update (fp32, ZeRO-2).

Every test is marked ``gpu``: deselected by default (pyproject's ``-m 'not slow and not gpu'``) and
skipped without CUDA (tests/conftest.py). Run them on a GPU machine with

    python -m pytest -m gpu tests/engines/test_gpu.py -p no:cacheprovider

(``bench/gpu_check.sh`` does this on a machine without network). The first DeepSpeed test
JIT-compiles DeepSpeed's FusedAdam with nvcc (about a minute; cached in TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm
from stages.engines.rollout_hf import SamplingSettings, generate_sequences
from stages.metrics.flops import device_peak_flops

pytestmark = pytest.mark.gpu

LOSS_CONFIG = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
CUDA = torch.device("cuda", 0)
# bf16 vs fp32 log-probs of the ×4-scaled tiny model (logit spread ≈ 0.5 nats): measured on CPU
# bf16 max |Δ| 0.013, mean 0.0045; a model with other weights differs by mean ≈ 0.44.
BF16_MAX_ABS, BF16_MEAN_ABS = 0.06, 0.02


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """No TF32 in fp32 matmuls (PyTorch's default, pinned here): the fp32 tests compare tightly."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def scaled_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine tests' tiny model with its matrices ×4, so log-probs spread beyond ≈ −log V and
    a wrong forward pass shows (at init scale every row is close to uniform)."""
    model = load_causal_lm(tiny_model_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.mul_(4.0)
    path = tmp_path_factory.mktemp("tiny-lm-scaled")
    model.save_pretrained(path)
    return path


def on_cuda(batch: DataProto) -> DataProto:
    return DataProto(
        batch=batch.batch.to(CUDA), non_tensor_batch={}, meta_info=dict(batch.meta_info)
    )


def full_weights(engine) -> dict[str, torch.Tensor]:
    """fp32 CPU copies of every parameter (gathered under ZeRO-3)."""
    import deepspeed

    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {name: p.detach().float().cpu().clone() for name, p in params.items()}


def ppo_batch(make_rollout_batch, seed: int) -> DataProto:
    return make_rollout_batch(
        [3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=seed
    )


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_bf16_update_runs_and_changes_weights(scaled_model_dir, make_rollout_batch, zero_stage):
    torch.manual_seed(0)
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(scaled_model_dir)),
        EngineSettings(zero_stage=zero_stage, dtype="bf16", lr=1e-3),
    )
    assert engine.device.type == "cuda"
    before = full_weights(engine)
    settings = PPOUpdateSettings(mini_batch_size=4, micro=MicroBatching(micro_batch_size=2))
    metrics = update_actor(engine, on_cuda(ppo_batch(make_rollout_batch, 3)), settings, LOSS_CONFIG)
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        values = torch.tensor([float(v) for v in metrics[name].values])
        assert torch.isfinite(values).all(), (name, values)
    assert len(metrics["actor/grad_norm"].values) == 2  # one optimizer step per mini-batch
    after = full_weights(engine)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) // 2, f"only {changed} changed"
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_bf16_log_prob_close_to_fp32(scaled_model_dir, make_rollout_batch, zero_stage):
    batch = on_cuda(make_rollout_batch([3, 5, 1, 4, 2, 6], [4, 2, 1, 3, 4, 4], P=6, R=4, seed=4))
    fp32 = ResponseLogProbModel(load_causal_lm(scaled_model_dir)).to(CUDA).eval()
    expected, _ = compute_log_prob(fp32, batch, MicroBatching())
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(scaled_model_dir)),
        EngineSettings(zero_stage=zero_stage, dtype="bf16"),
    )
    engine.eval()
    got, metrics = compute_log_prob(
        engine, batch, MicroBatching(micro_batch_size=2), calculate_entropy=True
    )
    mask = batch.batch["response_mask"].bool()
    diff = (got.batch["old_log_probs"] - expected.batch["old_log_probs"]).abs()[mask]
    assert got.batch["old_log_probs"].dtype == torch.float32
    assert diff.max() <= BF16_MAX_ABS and diff.mean() <= BF16_MEAN_ABS, (diff.max(), diff.mean())
    assert 0 < metrics["actor/entropy"] < torch.log(torch.tensor(67.0))


def fp32_updated_weights(model_dir: Path, micro: MicroBatching, batch: DataProto):
    torch.manual_seed(0)
    # A large Adam eps, as in test_actor: gradients that are pure rounding noise stay ≪ lr.
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(model_dir)),
        EngineSettings(zero_stage=2, dtype="float32", lr=1e-2, eps=1e-3, clip_grad=1.0),
    )
    settings = PPOUpdateSettings(mini_batch_size=4, micro=micro)
    metrics = update_actor(engine, on_cuda(batch), settings, LOSS_CONFIG)
    return full_weights(engine), metrics


def test_fp32_zero2_update_is_invariant_to_micro_batch_split(tiny_model_dir, make_rollout_batch):
    batch = ppo_batch(make_rollout_batch, 1)
    whole, whole_metrics = fp32_updated_weights(tiny_model_dir, MicroBatching(), batch)
    split, split_metrics = fp32_updated_weights(
        tiny_model_dir, MicroBatching(micro_batch_size=1), batch
    )
    budget, _ = fp32_updated_weights(
        tiny_model_dir, MicroBatching(use_dynamic_bsz=True, max_token_len=12), batch
    )
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-5, rtol=1e-4, msg=name)
        torch.testing.assert_close(budget[name], whole[name], atol=1e-5, rtol=1e-4, msg=name)
    assert whole_metrics["actor/pg_loss"].aggregate() == pytest.approx(
        split_metrics["actor/pg_loss"].aggregate(), abs=1e-5
    )


@pytest.fixture(scope="module")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stages.data.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("demo-model"))


def prompt_batch(rows: int, width: int, vocab: int, pad: int, seed: int = 0) -> DataProto:
    """Left-padded random prompts (ids ≥ 3, no special token) on CUDA with HF position ids."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) >= width - lengths[:, None]).long()  # (B, P)
    ids = torch.randint(3, vocab, (rows, width), generator=generator).masked_fill(mask == 0, pad)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[rows]).to(CUDA), non_tensor_batch={}, meta_info={}
    )


def sampling(config, **overrides) -> SamplingSettings:
    return SamplingSettings(
        response_length=12,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        **overrides,
    )


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_hf_rollout_layout_on_cuda(demo_model_dir, dtype):
    model = load_causal_lm(demo_model_dir, dtype=dtype).to(CUDA)
    config = model.config
    prompts = prompt_batch(8, 7, config.vocab_size, config.pad_token_id)
    out = generate_sequences(model, prompts, sampling(config, temperature=0.9)).batch
    B, P, R = 8, 7, 12
    assert out["responses"].shape == (B, R) and out["input_ids"].shape == (B, P + R)
    assert all(t.device.type == "cuda" for t in out.values())
    mask = out["response_mask"]
    assert torch.equal(mask, mask.cummin(dim=1).values), "response_mask is not a prefix of ones"
    assert torch.equal(out["input_ids"][:, :P], prompts.batch["input_ids"])
    assert (out["responses"][mask == 0] == config.pad_token_id).all()
    assert (out["rollout_log_probs"][mask == 0] == 0).all()
    assert (out["rollout_log_probs"][mask == 1] < 0).all()


def test_hf_rollout_log_probs_match_recomputation_on_cuda(demo_model_dir):
    model = load_causal_lm(demo_model_dir).to(CUDA)
    prompts = prompt_batch(8, 7, model.config.vocab_size, model.config.pad_token_id, seed=1)
    out = generate_sequences(model, prompts, sampling(model.config, temperature=0.7))
    batch = DataProto(batch=out.batch, non_tensor_batch={}, meta_info={"temperature": 0.7})
    recomputed, _ = compute_log_prob(ResponseLogProbModel(model).eval(), batch, MicroBatching())
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(
        recomputed.batch["old_log_probs"][mask],
        out.batch["rollout_log_probs"][mask],
        atol=2e-4,
        rtol=2e-4,
    )


def test_hf_greedy_rollout_is_deterministic_on_cuda(demo_model_dir):
    model = load_causal_lm(demo_model_dir).to(CUDA)
    prompts = prompt_batch(6, 5, model.config.vocab_size, model.config.pad_token_id, seed=2)
    greedy = sampling(model.config, do_sample=False)
    first = generate_sequences(model, prompts, greedy).batch["responses"]
    second = generate_sequences(model, prompts, greedy).batch["responses"]
    assert torch.equal(first, second)


def test_actor_worker_round_on_cuda(demo_model_dir):
    """The role worker the flow calls, fed host (CPU) batches as the flow holds them: rollout →
    log-probs → bf16 ZeRO-3 update. The worker must move batches to its device itself."""
    from stages.config import load_config
    from stages.engines.roles import ActorWorker

    config = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={demo_model_dir}",
            "actor_rollout_ref.model.dtype=bfloat16",
            "actor_rollout_ref.actor.zero_stage=3",
            "trainer.device=cuda",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "data.max_response_length=6",
        ],
    )
    torch.manual_seed(0)
    actor = ActorWorker(config, total_training_steps=3)
    prompts = prompt_batch(8, 5, actor.lm.config.vocab_size, actor.tokenizer.pad_token_id)
    prompts.batch = prompts.batch.cpu()
    prompts.meta_info["temperature"] = 1.0
    gen = actor.generate_sequences(prompts).batch.cpu()
    batch = DataProto(batch=gen, non_tensor_batch={}, meta_info={"temperature": 1.0})
    log_prob_out = actor.compute_log_prob(batch)
    old = log_prob_out.batch["old_log_probs"].cpu()
    mask = gen["response_mask"].bool()
    diff = (old - gen["rollout_log_probs"]).abs()[mask]
    assert diff.max() <= BF16_MAX_ABS, diff.max()  # bf16 rollout vs bf16 recomputation
    batch.batch["old_log_probs"] = old
    batch.batch["advantages"] = torch.randn(mask.shape) * gen["response_mask"]
    metrics = actor.update_actor(batch).meta_info["metrics"]
    assert len(metrics["actor/pg_loss"].values) == 2  # 8 rows / (1 prompt × n = 4)
    assert all(torch.isfinite(torch.as_tensor(float(v))) for v in metrics["actor/pg_loss"].values)
    # verl's efficiency metrics, on a device of the peak table (H100 / H200 where this runs)
    if device_peak_flops(torch.cuda.get_device_name()) is not None:
        assert 0 < metrics["perf/mfu/actor"] < 1
        assert 0 < log_prob_out.meta_info["metrics"]["perf/mfu/actor_infer"] < 1
        assert metrics["actor/perf/max_memory_allocated_gb"] > 0
