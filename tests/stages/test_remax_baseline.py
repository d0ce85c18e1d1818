"""ReMax's baseline stages on hand-built batches with fake engines: one greedy response per
prompt group (baseline_rollout), scored once per group by the reward route (baseline_reward),
and the advantage stage subtracting it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from flows.dag import batch_keys, plan_step
from stages.advantage import advantage_fn
from stages.engines.roles import sampling_settings
from stages.ppo import PPO_STAGES, make_step_input
from stages.reward.baseline import BASELINE_METRIC, baseline_reward_fn
from stages.reward.loop import LoopResult
from stages.reward.reward_model import ModelScores
from stages.reward.stage import LOOP_ENGINE, MODEL_ENGINE
from stages.rollout import baseline_rollout_fn, prompt_groups
from stages.stage import StageContext

R = 4  # response width


def loader_batch(prompt_ids: list[list[int]]) -> DataProto:
    """A loader batch of prompts (G, P), left-padded with 0 where an id is 0."""
    ids = torch.tensor(prompt_ids)
    mask = (ids != 0).long()
    return DataProto(
        batch=TensorDict(
            {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
            batch_size=[len(ids)],
        ),
        non_tensor_batch={
            "data_source": np.array(["demo"] * len(ids), dtype=object),
            "reward_model": np.array(
                [{"ground_truth": str(i)} for i in range(len(ids))], dtype=object
            ),
            "extra_info": np.array([{"index": i} for i in range(len(ids))], dtype=object),
        },
        meta_info={},
    )


def step_input(n: int = 3, shuffle: bool = True) -> DataProto:
    """3 prompts × n rows; shuffled like the balance stage may leave them (groups not adjacent)."""
    batch = make_step_input(
        loader_batch([[0, 5, 6], [7, 8, 9], [0, 0, 4]]), n, temperature=1.0, global_steps=1
    )
    if shuffle:
        batch = batch.select_idxs(
            torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))
        )
    return batch


def greedy_of(prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fake actor's 'greedy' answer to each prompt row: (B, R) tokens and mask, both a
    function of the prompt's last id (so a row's baseline shows which prompt it came from)."""
    last = prompt_ids[:, -1:]  # (B, 1)
    responses = last * 10 + torch.arange(R)  # (B, R)
    lengths = last.squeeze(-1) % (R + 1)  # 0..R valid tokens; prompt [0, 0, 4] → 4, 9 → 4, 6 → 1
    mask = (torch.arange(R) < lengths[:, None]).long()
    return responses, mask


# --- prompt groups ---


def test_prompt_groups_follow_first_appearance_and_index_every_row():
    first, group = prompt_groups(np.array(["x", "y", "x", "z", "y", "y"], dtype=object))
    assert first.tolist() == [0, 1, 3]
    assert group.tolist() == [0, 1, 0, 2, 1, 1]
    values = torch.tensor([10, 20, 30, 40, 50, 60])
    assert values[first][group].tolist() == [10, 20, 10, 40, 20, 20]


# --- baseline_rollout ---


def test_baseline_rollout_generates_one_greedy_response_per_prompt_repeated_to_its_rows(
    fake_engine, make_config
):
    batch = step_input(n=3)
    seen = []

    def generate(prompts, validate, greedy):
        seen.append((prompts, validate, greedy))
        responses, mask = greedy_of(prompts.batch["input_ids"])
        return DataProto.from_dict({"responses": responses, "response_mask": mask})

    actor = fake_engine(generate_sequences=generate)
    ctx = StageContext(make_config("algorithm.adv_estimator=remax"), engines={"actor": actor})
    delta = baseline_rollout_fn(batch, ctx)

    assert len(seen) == 1, "one generation call for the whole step"
    prompts, validate, greedy = seen[0]
    assert greedy is True and validate is False
    assert len(prompts) == 3, "one row per prompt group (uid), not per sample"
    assert len(set(map(tuple, prompts.batch["input_ids"].tolist()))) == 3
    assert sorted(delta.batch.keys()) == ["baseline_response_mask", "baseline_responses"]
    expected_responses, expected_mask = greedy_of(batch.batch["prompt_input_ids"])  # (9, R)
    assert delta.batch["baseline_responses"].shape == (9, R)
    assert torch.equal(delta.batch["baseline_responses"], expected_responses)
    assert torch.equal(delta.batch["baseline_response_mask"], expected_mask)
    uids = batch.non_tensor_batch["uid"]
    for uid in set(uids):
        rows = torch.from_numpy(np.flatnonzero(uids == uid))
        group = delta.batch["baseline_responses"][rows]
        assert len(rows) == 3 and torch.equal(group, group[:1].expand_as(group))


def test_baseline_rollout_refuses_a_uid_shared_by_two_prompts(fake_engine, make_config):
    batch = step_input(n=2, shuffle=False)
    batch.non_tensor_batch["uid"][2] = batch.non_tensor_batch["uid"][0]  # row 2 is prompt 1
    actor = fake_engine(generate_sequences=lambda *a, **k: pytest.fail("must not generate"))
    ctx = StageContext(make_config("algorithm.adv_estimator=remax"), engines={"actor": actor})
    with pytest.raises(ValueError, match=r"share uid .* differ in 'prompt_input_ids'"):
        baseline_rollout_fn(batch, ctx)


def test_greedy_sampling_settings_ignore_the_sampling_config(make_config):
    class Tok:
        eos_token_id, pad_token_id = 2, 0

    cfg = make_config(
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.top_k=5",
        "actor_rollout_ref.rollout.top_p=0.9",
    )
    sampled = sampling_settings(cfg, Tok(), validate=False)
    greedy = sampling_settings(cfg, Tok(), validate=False, greedy=True)
    assert (sampled.do_sample, sampled.temperature, sampled.top_k, sampled.top_p) == (
        True, 0.7, 5, 0.9
    )  # fmt: skip
    assert (greedy.do_sample, greedy.temperature, greedy.top_k, greedy.top_p) == (
        False, 1.0, -1, 1.0
    )  # fmt: skip
    assert greedy.response_length == sampled.response_length
    assert greedy.generation_config().do_sample is False


# --- baseline_reward ---


def scored_batch() -> DataProto:
    """The step input plus greedy responses; prompt [0, 0, 4]'s greedy response is empty."""
    batch = step_input(n=3)
    responses, mask = greedy_of(batch.batch["prompt_input_ids"])
    mask[batch.batch["prompt_input_ids"][:, -1] == 4] = 0
    return batch | DataProto.from_dict(
        {"baseline_responses": responses, "baseline_response_mask": mask}
    )


class FakeLoop:
    """The reward loop's ``score``: each row's score = 1 + 0.1 · (sum of its valid response ids)
    (non-zero for an empty response too: the baseline of one is still 0, nothing is placed)."""

    def __init__(self) -> None:
        self.batches: list[DataProto] = []

    def score(self, batch: DataProto) -> LoopResult:
        self.batches.append(batch)
        width = batch.batch["responses"].shape[1]
        valid = batch.batch["attention_mask"][:, -width:]
        scores = 1.0 + 0.1 * (batch.batch["responses"] * valid).sum(-1).double().numpy()
        acc = np.array([1.0] * len(batch), dtype=object)
        return LoopResult(scores, {"acc": acc}, [], {"error": 0, "timeout": 0, "invalid": 0})


def expected_baselines(batch: DataProto) -> torch.Tensor:
    valid = batch.batch["baseline_response_mask"]
    scores = 1.0 + 0.1 * (batch.batch["baseline_responses"] * valid).sum(-1)
    return torch.where(valid.sum(-1) > 0, scores, 0.0).float()


def test_baseline_reward_scores_each_greedy_sequence_once_and_repeats_it(make_config):
    batch = scored_batch()
    loop = FakeLoop()
    ctx = StageContext(make_config("algorithm.adv_estimator=remax"), engines={LOOP_ENGINE: loop})
    ctx.metrics["reward/score_mean"] = 0.123  # the reward stage's, must stay untouched
    delta = baseline_reward_fn(batch, ctx)

    assert len(loop.batches) == 1 and len(loop.batches[0]) == 3, "one sequence per prompt"
    seen = loop.batches[0]
    P = batch.batch["prompt_input_ids"].shape[1]
    assert torch.equal(seen.batch["input_ids"][:, :P], seen.batch["prompts"])
    assert torch.equal(seen.batch["input_ids"][:, P:], seen.batch["responses"])
    assert set(seen.non_tensor_batch) == {"uid", "data_source", "reward_model", "extra_info"}
    first_rows, _ = prompt_groups(batch.non_tensor_batch["uid"])
    assert list(seen.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"][first_rows])
    assert torch.equal(
        seen.batch["attention_mask"],
        torch.cat([batch.batch["prompt_attention_mask"], batch.batch["baseline_response_mask"]], 1)[
            first_rows
        ],
    )

    assert sorted(delta.batch.keys()) == ["reward_baselines"] and not delta.non_tensor_batch
    baselines = delta.batch["reward_baselines"]
    assert baselines.shape == (9,) and baselines.dtype == torch.float32
    torch.testing.assert_close(baselines, expected_baselines(batch))
    empty = batch.batch["prompt_input_ids"][:, -1] == 4
    assert torch.all(baselines[empty] == 0)  # an empty greedy response places no score
    assert ctx.metrics[BASELINE_METRIC] == pytest.approx(
        float(expected_baselines(batch)[first_rows].mean())
    )
    assert ctx.metrics["reward/score_mean"] == 0.123


def test_baseline_reward_takes_the_reward_model_route_when_it_replaces_the_loop(make_config):
    class FakeRewardModel:
        def score(self, batch):
            return ModelScores(batch.batch["responses"][:, 0].float(), {"reward_model/x": 1.0})

    cfg = make_config(
        "algorithm.adv_estimator=remax",
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=/nowhere",
    )
    batch = scored_batch()
    ctx = StageContext(cfg, engines={MODEL_ENGINE: FakeRewardModel()})
    delta = baseline_reward_fn(batch, ctx)
    has_response = batch.batch["baseline_response_mask"].sum(-1) > 0
    expected = torch.where(has_response, batch.batch["baseline_responses"][:, 0].float(), 0.0)
    torch.testing.assert_close(delta.batch["reward_baselines"], expected)
    assert "reward_model/x" not in ctx.metrics  # only reward/baseline_mean is reported


# --- the plan and the advantage ---


def test_remax_plan_runs_the_baseline_stages_and_others_skip_them(make_config):
    keys = batch_keys(step_input(n=2))
    plan = plan_step(PPO_STAGES, make_config("algorithm.adv_estimator=remax"), keys, step=1)
    assert plan.names == [
        "rollout",
        "baseline_rollout",
        "balance",
        "reward",
        "baseline_reward",
        "old_log_prob",
        "advantage",
        "update_actor",
    ]
    for estimator in ("grpo", "rloo", "reinforce_plus_plus"):
        other = plan_step(PPO_STAGES, make_config(f"algorithm.adv_estimator={estimator}"), keys, 1)
        assert {"baseline_rollout", "baseline_reward"} <= set(other.skipped), estimator


def test_advantage_stage_subtracts_the_baseline_on_valid_tokens(rollout_batch, make_config):
    baselines = torch.tensor([0.4, 0.4, 1.0, 1.0])
    batch = rollout_batch | DataProto.from_dict({"reward_baselines": baselines})
    delta = advantage_fn(batch, StageContext(make_config("algorithm.adv_estimator=remax")))
    mask = rollout_batch.batch["response_mask"].float()
    returns = rollout_batch.batch["rm_scores"].flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(delta.batch["returns"], returns)
    torch.testing.assert_close(delta.batch["advantages"], (returns - baselines[:, None]) * mask)
    # row 0: score 1.0 at token 1, baseline 0.4 → 0.6 on its two valid tokens, not whitened
    torch.testing.assert_close(delta.batch["advantages"][0], torch.tensor([0.6, 0.6, 0.0]))


def test_advantage_stage_without_baselines_names_the_missing_key(rollout_batch, make_config):
    with pytest.raises((KeyError, ValueError), match="reward_baselines"):
        advantage_fn(rollout_batch, StageContext(make_config("algorithm.adv_estimator=remax")))
