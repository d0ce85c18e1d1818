"""actor_rollout_ref.rollout.ignore_eos: generation continues past EOS (HF and vLLM), every
response has R tokens and its mask covers them all."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from dataproto import DataProto
from stages.config import load_config
from stages.engines.roles import sampling_settings
from stages.engines.rollout_hf import SamplingSettings, generate_sequences
from stages.engines.rollout_vllm import VLLMRollout
from stages.rollout import BASELINE_ROLLOUT_STAGE, ROLLOUT_STAGE

VOCAB, PAD, EOS, R = 67, 0, 2, 12


@pytest.fixture(scope="module")
def eos_prone_lm() -> Qwen2ForCausalLM:
    """A tiny random LM with EOS made likely, so sampled rows would stop early."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        eos_token_id=EOS, pad_token_id=PAD,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.6 * model.lm_head.weight.abs().mean()
    return model


def _prompts(rows: int = 8, width: int = 5) -> DataProto:
    ids = torch.randint(3, VOCAB, (rows, width), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    td = TensorDict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
        batch_size=[rows],
    )
    return DataProto(batch=td, non_tensor_batch={}, meta_info={})


def _generate(model, ignore_eos: bool) -> TensorDict:
    settings = SamplingSettings(
        response_length=R, eos_token_id=EOS, pad_token_id=PAD, ignore_eos=ignore_eos
    )
    torch.manual_seed(4)
    return generate_sequences(model, _prompts(), settings).batch


def test_hf_generation_continues_past_eos(eos_prone_lm):
    stopping = _generate(eos_prone_lm, ignore_eos=False)
    assert (stopping["response_mask"].sum(-1) < R).any()  # without it, some rows stop at EOS
    out = _generate(eos_prone_lm, ignore_eos=True)
    assert (out["response_mask"] == 1).all() and (out["attention_mask"][:, -R:] == 1).all()
    responses = out["responses"]
    has_inner_eos = [(row[:-1] == EOS).any() and (row[-1] != PAD) for row in responses]
    assert any(has_inner_eos), "an EOS mid-response is followed by more generated tokens"
    assert (out["rollout_log_probs"] != 0).all()  # every token is a sampled, scored token


def test_settings_stop_ids():
    base = dict(response_length=4, eos_token_id=(EOS, 5), pad_token_id=PAD)
    assert SamplingSettings(**base).stop_ids == (EOS, 5)
    ignoring = SamplingSettings(**base, ignore_eos=True)
    assert ignoring.stop_ids == () and ignoring.generation_config().eos_token_id == []


class _Tokenizer:
    eos_token_id, pad_token_id = EOS, PAD


@pytest.mark.parametrize("call", [dict(validate=False), dict(validate=True), dict(greedy=True)])
def test_sampling_settings_carry_ignore_eos_to_every_call(call):
    on = load_config(None, ["actor_rollout_ref.rollout.ignore_eos=true"])
    kwargs = {"validate": False, **call}
    assert sampling_settings(on, _Tokenizer(), **kwargs).ignore_eos is True
    assert sampling_settings(load_config(None), _Tokenizer(), **kwargs).ignore_eos is False


def test_vllm_sampling_params_kwargs(monkeypatch):
    """The SamplingParams kwargs, with a stand-in ``vllm`` module (vLLM is not in this venv):
    vLLM's own EOS is always ignored and the stop ids are ours: EOS, or none."""
    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    rollout = VLLMRollout.__new__(VLLMRollout)  # no engine: only sampling_params is used
    rollout.allow_truncated_log_probs = False
    settings = SamplingSettings(response_length=R, eos_token_id=EOS, pad_token_id=PAD)
    stopping = rollout.sampling_params(settings)
    assert stopping["ignore_eos"] is True and stopping["stop_token_ids"] == [EOS]
    assert stopping["max_tokens"] == R
    ignoring = rollout.sampling_params(
        SamplingSettings(response_length=R, eos_token_id=EOS, pad_token_id=PAD, ignore_eos=True)
    )
    assert ignoring["ignore_eos"] is True and ignoring["stop_token_ids"] == []


def test_rollout_stages_key_their_cache_on_ignore_eos():
    for stage in (ROLLOUT_STAGE, BASELINE_ROLLOUT_STAGE):
        assert "actor_rollout_ref.rollout.ignore_eos" in stage.config_keys
