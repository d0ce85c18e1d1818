"""A tiny Qwen2 causal LM on disk, rollout-shaped batches and a Prefect server for the engine tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from dataproto import DataProto

VOCAB, PAD, EOS = 67, 0, 2

#: a plugin module that registers a rollout backend when imported (test_vllm_on_ray imports it)
collect_ignore = ["vllm_greedy_check.py"]


def write_tiny_lm(path: Path, **overrides) -> Path:
    """A tiny random Qwen2 causal LM saved at ``path`` (seed 0): 2 layers, hidden 64, 2 query
    heads sharing 1 K/V head; ``overrides`` change the config."""
    torch.manual_seed(0)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(Qwen2Config(**{**settings, **overrides})).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


@pytest.fixture
def make_tiny_lm():
    """The :func:`write_tiny_lm` writer, for tests (conftest modules are not importable)."""
    return write_tiny_lm


def prompt_batch(tokenizer, texts: list[str], n: int = 1) -> DataProto:
    """``texts`` tokenized (left-padded as the tokenizer pads), each repeated ``n`` times
    (adjacent): ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, P), meta temperature 1."""
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    ids = encoded["input_ids"].repeat_interleave(n, 0)
    mask = encoded["attention_mask"].repeat_interleave(n, 0)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[len(ids)]),
        non_tensor_batch={},
        meta_info={"temperature": 1.0},
    )


@pytest.fixture
def encode_prompts():
    """The :func:`prompt_batch` builder, for tests (conftest modules are not importable)."""
    return prompt_batch


def tiny_actor_config(model_dir: Path, *extra: str):
    """configs/demo-cpu.yaml on the tiny model at ``model_dir``, sized for one actor's tests: 2
    prompts per step in mini-batches of 1, micro-batches of 2, 6 response tokens; ``extra``
    overrides last."""
    from stages.config import load_config

    return load_config(
        Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "data.max_response_length=6",
            *extra,
        ],
    )


@pytest.fixture(scope="session")
def actor_config():
    """``f(model_dir, *extra overrides) -> config``: :func:`tiny_actor_config`."""
    return tiny_actor_config


@pytest.fixture
def make_rollout_batch():
    """The :func:`rollout_batch` builder, for tests (conftest modules are not importable)."""
    return rollout_batch


def rollout_batch(
    prompt_lens: list[int], response_lens: list[int], P: int, R: int, seed: int = 0
) -> DataProto:
    """Left-padded prompts ‖ right-padded responses, random advantages and old log-probs."""
    generator = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    input_ids = torch.randint(3, VOCAB, (B, P + R), generator=generator)
    attention_mask = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention_mask[i, P - p : P + r] = 1
    input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, P:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "prompts": input_ids[:, :P],
        "responses": input_ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(B, R, generator=generator) * response_mask,
        "old_log_probs": (-3.0 + 0.3 * torch.randn(B, R, generator=generator)) * response_mask,
        "returns": torch.randn(B, R, generator=generator) * response_mask,
        "values": torch.randn(B, R, generator=generator) * response_mask,
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[B]),
        non_tensor_batch={},
        meta_info={"temperature": 1.0},
    )


@pytest.fixture(scope="session")
def scaled_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny model (``make_tiny_model``, seed 0) with its layer matrices scaled ×6: at
    init scale the tied embeddings dominate and greedy repeats the last prompt token, which would
    hide stale weights or KV and make greedy independent of the prompt."""
    from stages.data.tiny_model import load_causal_lm, make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-scaled"), seed=0)
    model = load_causal_lm(path, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".layers." in name and parameter.ndim == 2:
                parameter.mul_(6.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def prefect_server():
    """A temporary Prefect server and database for a module's flow runs (the flows tests'
    session harness lives in tests/flows/conftest.py, out of this directory's reach)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield
