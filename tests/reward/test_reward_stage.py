"""The reward stage: skip rule, routes, combine rule, delta contents and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config

from dataproto import keys as K
from flows.stage_task import check_delta
from stages.config.root import PPORunConfig
from stages.reward.reward_model import RewardModel
from stages.reward.settings import CONFIG_KEYS, RewardSettings, settings_from_config
from stages.reward.stage import (
    LOOP_ENGINE,
    MODEL_ENGINE,
    REWARD_STAGE,
    SEQ_SCORES,
    build_reward_engines,
    compute_reward,
    needs_scoring,
)
from stages.stage import StageContext

LOOP_ONLY = RewardSettings(num_workers=2, timeout_s=0.5, error_score=-1.0)


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory, tokenizer):
    torch.manual_seed(1)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("stage-rm")
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    return RewardModel(str(path), num_workers=8)


def test_loop_route_delta(script_loop, batch_factory):
    batch = batch_factory(["0.5", "dict:2", "raise", ""], eos=False)  # row 3: empty response, L = 0
    delta, metrics = compute_reward(batch, LOOP_ONLY, {LOOP_ENGINE: script_loop})
    lengths = batch.batch["attention_mask"][:, -8:].sum(-1).tolist()
    assert lengths == [3, 6, 5, 0]
    rm_scores = delta.batch[K.RM_SCORES]
    assert rm_scores.shape == (4, 8) and rm_scores.dtype == torch.float32
    assert rm_scores[0, 2] == 0.5 and rm_scores[1, 5] == 2.0 and rm_scores[2, 4] == -1.0
    assert torch.equal(rm_scores[3], torch.zeros(8))  # aborted: nothing in the padding
    assert rm_scores.sum(-1).tolist() == [0.5, 2.0, -1.0, 0.0]
    assert delta.batch[SEQ_SCORES].tolist() == [
        0.5,
        2.0,
        -1.0,
        7.0,
    ]  # the aborted row keeps its score
    assert delta.meta_info[K.REWARD_EXTRA_KEYS] == ["acc", "score", "pred"]
    assert delta.non_tensor_batch["pred"].tolist() == [None, "2", None, None]
    assert metrics["reward/error_count"] == 1.0  # "raise"
    assert metrics["reward/invalid_count"] == 0.0 and metrics["reward/timeout_count"] == 0.0
    assert metrics["reward/aborted_count"] == 1.0
    assert metrics["reward/score_mean"] == pytest.approx((0.5 + 2.0 - 1.0) / 3)  # non-aborted rows
    assert metrics["reward/time_s"] > 0
    assert set(delta.batch.keys()) == {K.RM_SCORES, SEQ_SCORES}
    merged = batch.union(delta)  # the flow unions the delta into the step batch
    assert not needs_scoring(merged) and merged.non_tensor_batch["score"][1] == 2.0


def test_skipped_when_rm_scores_present(batch_factory):
    batch = batch_factory(["1", "2"])
    assert needs_scoring(batch)
    batch.batch[K.RM_SCORES] = torch.ones(2, 8)
    assert not needs_scoring(batch)
    delta, metrics = compute_reward(batch, LOOP_ONLY, engines={})  # no engine is touched
    check_delta(REWARD_STAGE, delta, len(batch))  # the declared keys, as the flow requires
    assert delta.batch[SEQ_SCORES].tolist() == [8.0, 8.0]
    assert delta.non_tensor_batch == {} and delta.meta_info == {K.REWARD_EXTRA_KEYS: []}
    assert metrics == {"reward/skipped": 1.0}
    assert batch.union(delta).batch[K.RM_SCORES].sum() == 16.0


def test_stage_fn_reads_config_and_engines(script_loop, batch_factory):
    config = PPORunConfig()
    ctx = StageContext(config=config, engines={LOOP_ENGINE: script_loop})
    delta = REWARD_STAGE.fn(batch_factory(["1", "2"]), ctx)
    assert delta.batch[K.RM_SCORES].sum(-1).tolist() == [1.0, 2.0]
    assert ctx.metrics["reward/score_mean"] == 1.5
    with pytest.raises(KeyError, match=r"ctx\.engines\['reward_loop'\]"):
        REWARD_STAGE.fn(batch_factory(["1"]), StageContext(config=config))
    REWARD_STAGE.check_inputs(batch_factory(["1"]))
    assert REWARD_STAGE.config_keys == CONFIG_KEYS


def test_settings_from_config():
    settings = settings_from_config(PPORunConfig())
    assert settings == RewardSettings(num_workers=8, timeout_s=60.0, error_score=0.0)
    assert settings.uses_loop


def test_reward_model_route_replace_and_sum(script_loop, reward_model, batch_factory):
    batch = batch_factory([str(i) for i in range(13)])
    model_scores = reward_model.score(batch).scores
    replace = RewardSettings(num_workers=8, reward_model_enable=True, reward_model_path="rm")
    delta, metrics = compute_reward(batch, replace, {MODEL_ENGINE: reward_model})
    torch.testing.assert_close(delta.batch[SEQ_SCORES], model_scores)
    torch.testing.assert_close(delta.batch[K.RM_SCORES].sum(-1), model_scores)
    assert delta.meta_info[K.REWARD_EXTRA_KEYS] == []
    assert metrics["reward_model/num_rows"] == 13.0 and "reward/error_count" not in metrics
    summed = RewardSettings(
        num_workers=8, reward_model_enable=True, reward_model_path="rm", combine="sum"
    )
    engines = {MODEL_ENGINE: reward_model, LOOP_ENGINE: script_loop}
    delta, metrics = compute_reward(batch, summed, engines)
    torch.testing.assert_close(delta.batch[SEQ_SCORES], model_scores + torch.arange(13.0))
    assert math.isclose(
        metrics["reward/score_mean"],
        float((model_scores + torch.arange(13.0)).mean()),
        rel_tol=1e-5,
    )


def test_build_engines_and_settings_errors(tokenizer):
    engines = build_reward_engines(RewardSettings(num_workers=1), tokenizer)
    try:
        assert list(engines) == [LOOP_ENGINE]
    finally:
        engines[LOOP_ENGINE].close()
    with pytest.raises(ValueError, match="model_path"):
        RewardSettings(reward_model_enable=True)
    with pytest.raises(ValueError, match="num_workers"):
        RewardSettings(num_workers=0)
    with pytest.raises(ValueError, match="combine"):
        RewardSettings(combine="max")
