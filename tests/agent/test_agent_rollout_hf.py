"""The rollout stage's agent path on the tiny model with HF generate: multi-turn trajectories,
tool turns from the sandbox, masks, and the actor's recomputed log-probs equal to the rollout's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.loop import GeneratedTurn
from stages.agent.rollout import AGENT_ENGINE, AgentRuntime, tool_schemas
from stages.config import apply_overrides, load_config
from stages.data.tiny_model import make_tiny_model
from stages.data.tokenize import encode_prompt
from stages.engines.roles import ActorWorker
from stages.rollout import ROLLOUT_STAGE, rollout_fn
from stages.stage import StageContext

REPO = Path(__file__).resolve().parents[2]
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'


class Direct:
    """The actor called like a worker group (``flows.engines.InProcessRole`` without flows)."""

    def __init__(self, worker) -> None:
        self.worker = worker

    def call(self, method, batch, **kwargs):
        return getattr(self.worker, method)(batch, **kwargs)


@pytest.fixture(scope="module")
def run_setup(tmp_path_factory, write_lookup_tool_config):
    root = tmp_path_factory.mktemp("agent")
    write_lookup_tool_config(root / "tools.yaml")
    model_dir = make_tiny_model(root / "model")
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.dtype=float32",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.response_length=160",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root / 'tools.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
            "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=2",
            "reward.score_in_rollout=false",  # the tests below score after; the last one inside
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ],
    )
    actor = ActorWorker(config, total_training_steps=2)
    runtime = AgentRuntime(config, actor.tokenizer)
    yield config, actor, runtime
    runtime.close()


def step_batch(actor, config, texts: list[str], n: int) -> DataProto:
    """The step input's prompt tensors (with the tools rendered in), ``n`` samples per prompt."""
    ids = [
        encode_prompt(actor.tokenizer, [{"role": "user", "content": t}], tool_schemas(config))
        for t in texts
    ]
    width = max(map(len, ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long) + actor.tokenizer.pad_token_id
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, width - len(seq) :] = 1
    input_ids, mask = input_ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    tensors = {
        K.PROMPT_INPUT_IDS: input_ids,
        K.PROMPT_ATTENTION_MASK: mask,
        K.PROMPT_POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[len(input_ids)]), non_tensor_batch={}, meta_info={}
    )


def forced_tool_call(actor, monkeypatch):
    """Make the actor's first turn write a tool call (a random tiny model would not): the first
    generation round returns the call's ids with log-probs recomputed by the actor itself, so the
    trajectory is still one the policy scores; later rounds sample from the model."""
    from stages.agent import rollout as agent_rollout_module

    real = agent_rollout_module.engine_generate
    call_ids = [
        *actor.tokenizer.encode(CALL_TEXT, add_special_tokens=False),
        actor.tokenizer.eos_token_id,
    ]

    def engine_generate(ctx, pad_id, eos_ids, validate=False, base="rollout"):
        sample = real(ctx, pad_id, eos_ids, validate, base)
        rounds = []

        def generate(contexts, max_new_tokens):
            rounds.append(len(contexts))
            if len(rounds) > 1:
                return sample(contexts, max_new_tokens)
            return [GeneratedTurn(list(call_ids), [0.0] * len(call_ids), True) for _ in contexts]

        return generate

    monkeypatch.setattr(agent_rollout_module, "engine_generate", engine_generate)


def test_multi_turn_rollout_has_tool_turns_masked_and_log_probs_the_actor_recomputes(
    run_setup, monkeypatch
):
    config, actor, runtime = run_setup
    forced_tool_call(actor, monkeypatch)
    batch = step_batch(actor, config, ["find a", "find b"], n=2)
    ctx = StageContext(
        config=config, engines={"actor": Direct(actor), AGENT_ENGINE: runtime}, step=1
    )
    out = rollout_fn(batch, ctx)
    t, nt = out.batch, out.non_tensor_batch
    assert set(t.keys()) >= {k.name for k in ROLLOUT_STAGE.produces}
    # every row: the forced call (mask 1), the tool turn (mask 0) with the looked-up value, then sampled ids
    text = actor.tokenizer.decode(
        t[K.RESPONSES][0][t[K.ATTENTION_MASK][0, batch.batch[K.PROMPT_INPUT_IDS].shape[1] :].bool()]
    )
    assert CALL_TEXT in text and "alpha" in text
    mask, attention = t[K.RESPONSE_MASK], t[K.ATTENTION_MASK][:, -t[K.RESPONSES].shape[1] :]
    assert ((mask == 0) & (attention == 1)).any(dim=1).all(), (
        "every row holds tool ids (mask 0, attended)"
    )
    assert (mask <= attention).all()
    assert (nt[K.NUM_TURNS] >= 4).all() and nt[K.TOOL_CALL_COUNTS].tolist() == [1, 1, 1, 1]
    assert (
        ctx.metrics["agent/tool/lookup/calls"] == 4.0
        and ctx.metrics["agent/tool/lookup/errors"] == 0.0
    )

    # token-exact: the actor's log-probs over the whole trajectory equal the rollout's on the
    # sampled ids of rounds 2+ (the forced first turn has no sampler log-probs)
    first_turn = len(actor.tokenizer.encode(CALL_TEXT, add_special_tokens=False)) + 1
    sampled = mask.bool().clone()
    sampled[:, :first_turn] = False
    assert sampled.any(), "the model sampled after the tool turn"
    step = DataProto(
        batch=t,
        non_tensor_batch={},
        meta_info={K.TEMPERATURE: config.actor_rollout_ref.rollout.temperature},
    )
    recomputed = actor.compute_log_prob(step).batch[K.OLD_LOG_PROBS]
    torch.testing.assert_close(
        recomputed[sampled], t[K.ROLLOUT_LOG_PROBS][sampled], atol=1e-5, rtol=1e-5
    )


def test_single_turn_rows_in_a_tool_run_take_one_turn(run_setup, monkeypatch):
    config, actor, runtime = run_setup
    forced_tool_call(actor, monkeypatch)  # both rows write a call; only the tool_agent row runs it
    batch = step_batch(actor, config, ["hello"], n=2)
    batch.non_tensor_batch["agent_name"] = np.array(["single_turn_agent", None], dtype=object)
    ctx = StageContext(
        config=config, engines={"actor": Direct(actor), AGENT_ENGINE: runtime}, step=1
    )
    out = rollout_fn(batch, ctx)
    assert out.non_tensor_batch["agent_stop_reason"][0] == "single_turn"
    assert out.non_tensor_batch[K.NUM_TURNS][0] == 2
    assert out.non_tensor_batch[K.TOOL_CALL_COUNTS].tolist() == [0, 1]


def test_the_same_step_samples_the_same_trajectories(run_setup):
    config, actor, runtime = run_setup
    batch = step_batch(actor, config, ["find a"], n=2)
    outs = []
    for _ in range(2):
        ctx = StageContext(
            config=config, engines={"actor": Direct(actor), AGENT_ENGINE: runtime}, step=3
        )
        outs.append(rollout_fn(batch, ctx).batch[K.RESPONSES])
    assert torch.equal(outs[0], outs[1])


def test_scores_inside_the_loop_equal_the_reward_stages_on_the_same_trajectories(
    run_setup, monkeypatch
):
    from stages.reward.loop import RewardLoop
    from stages.reward.settings import settings_from_config
    from stages.reward.stage import compute_reward

    config, actor, runtime = run_setup
    config = apply_overrides(config, ["reward.score_in_rollout=true"])
    forced_tool_call(actor, monkeypatch)
    batch = step_batch(actor, config, ["find a", "find b"], n=2)
    rows = len(batch)
    batch.non_tensor_batch |= {
        K.DATA_SOURCE: np.array(["openai/gsm8k"] * rows, dtype=object),
        K.REWARD_MODEL: np.array([{"ground_truth": "7"}] * rows, dtype=object),
        K.EXTRA_INFO: np.array([{"index": i} for i in range(rows)], dtype=object),
        K.UID: np.array(["u0", "u0", "u1", "u1"], dtype=object),
    }
    settings = replace(settings_from_config(config), num_workers=1)
    with RewardLoop(actor.tokenizer, settings) as loop:
        engines = {"actor": Direct(actor), AGENT_ENGINE: runtime, "reward_loop": loop}
        ctx = StageContext(config=config, engines=engines, step=2)
        out = rollout_fn(batch, ctx)
        assert K.RM_SCORES in out.batch and "acc" in out.non_tensor_batch
        assert ctx.metrics["reward/in_rollout_wait_s"] >= 0.0
        after = out.batch.exclude(K.RM_SCORES)
        scored_after = DataProto(
            batch=after, non_tensor_batch={**batch.non_tensor_batch, **out.non_tensor_batch}
        )
        stage_delta, _ = compute_reward(scored_after, settings, engines)
    torch.testing.assert_close(out.batch[K.RM_SCORES], stage_delta.batch[K.RM_SCORES])
    assert out.meta_info[K.REWARD_EXTRA_KEYS] == stage_delta.meta_info[K.REWARD_EXTRA_KEYS]
    # the reward stage, given the rollout's scores, passes them on and scores nothing
    passed, metrics = compute_reward(
        DataProto(batch=out.batch, non_tensor_batch={}, meta_info=dict(out.meta_info)), settings, {}
    )
    assert metrics == {"reward/skipped": 1.0}
    assert passed.meta_info[K.REWARD_EXTRA_KEYS] == out.meta_info[K.REWARD_EXTRA_KEYS]
