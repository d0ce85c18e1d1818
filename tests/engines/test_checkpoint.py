"""Engine checkpoints: a round trip gives the same next update, RNG states come back, a failed save
leaves the previous checkpoint intact, the Hugging Face export reloads with identical outputs, and
the latest-step tracker / pruning follow verl's layout."""

from __future__ import annotations

import json
import random

import deepspeed
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.checkpoint import (
    LATEST_FILE,
    checkpoint_dir,
    export_hf_model,
    load_engine_checkpoint,
    prune_checkpoints,
    read_latest_step,
    save_engine_checkpoint,
    write_latest_step,
)
from stages.engines.critic import ValueModel, compute_values, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine, step_lr_schedule
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm, load_value_model

ACTOR_LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
CRITIC_LOSS = {"cliprange_value": 0.5}
# warm-up + cosine: the scheduler state matters for the next step's lr
SETTINGS = dict(lr=1e-2, eps=1e-3, lr_scheduler="cosine", warmup_steps=1, total_steps=4)
UPDATE = PPOUpdateSettings(mini_batch_size=4, shuffle=True, micro=MicroBatching(micro_batch_size=2))


def make_engine(role, model_dir, zero_stage):
    torch.manual_seed(0)
    if role == "actor":
        module = ResponseLogProbModel(load_causal_lm(model_dir))
    else:
        module = ValueModel(load_value_model(model_dir))
    return initialize_engine(module, EngineSettings(zero_stage=zero_stage, **SETTINGS))


def update(role, engine, batch):
    """One training step of ``role``: the update, then the per-step LR schedule."""
    if role == "actor":
        metrics = update_actor(engine, batch, UPDATE, ACTOR_LOSS)
    else:
        metrics = update_critic(engine, batch, UPDATE, CRITIC_LOSS)
    step_lr_schedule(engine)
    return metrics


def full_weights(engine):
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.parametrize(
    ("role", "zero_stage"), [("actor", 0), ("actor", 3), ("critic", 2)], ids=str
)
def test_round_trip_gives_the_same_next_update(
    tiny_model_dir, tmp_path, make_rollout_batch, role, zero_stage
):
    first = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    second = make_rollout_batch(
        [2, 4, 5, 1, 3, 3, 5, 2], [1, 4, 4, 2, 3, 4, 2, 1], P=5, R=4, seed=2
    )
    original = make_engine(role, tiny_model_dir, zero_stage)
    update(role, original, first)
    path = save_engine_checkpoint(original, tmp_path / "ckpt", client_state={"global_steps": 1})

    restored = make_engine(role, tiny_model_dir, zero_stage)
    assert load_engine_checkpoint(restored, path) == {"global_steps": 1}
    assert restored.get_lr() == original.get_lr()
    before = full_weights(restored)
    for name, tensor in full_weights(original).items():
        torch.testing.assert_close(before[name], tensor, atol=0, rtol=0, msg=name)

    metrics_original = update(role, original, second)
    metrics_restored = update(role, restored, second)
    after_original, after_restored = full_weights(original), full_weights(restored)
    for name, tensor in after_original.items():
        torch.testing.assert_close(after_restored[name], tensor, atol=0, rtol=0, msg=name)
    assert any(not torch.equal(after_original[n], before[n]) for n in before)  # it did train
    assert restored.get_lr() == original.get_lr() != [SETTINGS["lr"]]  # the schedule went on alike
    grad_norm = f"{role}/grad_norm"
    assert metrics_restored[grad_norm].values == metrics_original[grad_norm].values


def test_rng_states_are_restored(tiny_model_dir, tmp_path):
    engine = make_engine("actor", tiny_model_dir, 0)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    save_engine_checkpoint(engine, tmp_path / "ckpt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    load_engine_checkpoint(engine, tmp_path / "ckpt")
    torch.testing.assert_close(torch.rand(3), expected[0], atol=0, rtol=0)
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_failed_save_keeps_the_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    engine = make_engine("actor", tiny_model_dir, 0)
    path = tmp_path / "global_step_1" / "actor"
    save_engine_checkpoint(engine, path, client_state={"step": 1})
    real_save = engine.save_checkpoint

    def save_then_fail(save_dir, **kwargs):
        real_save(save_dir, **kwargs)  # half-written files in the partial directory
        raise RuntimeError("disk full")

    monkeypatch.setattr(engine, "save_checkpoint", save_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        save_engine_checkpoint(engine, path, client_state={"step": 2})
    assert sorted(p.name for p in path.parent.iterdir()) == ["actor"]  # no partial left over
    assert load_engine_checkpoint(engine, path) == {"step": 1}

    fresh = tmp_path / "global_step_2" / "actor"
    with pytest.raises(RuntimeError, match="disk full"):
        save_engine_checkpoint(engine, fresh)
    assert not fresh.exists() and list(fresh.parent.iterdir()) == []


def test_overwrite_replaces_the_checkpoint(tiny_model_dir, tmp_path):
    engine = make_engine("actor", tiny_model_dir, 0)
    path = tmp_path / "ckpt"
    save_engine_checkpoint(engine, path, client_state={"step": 1})
    save_engine_checkpoint(engine, path, client_state={"step": 2})
    assert load_engine_checkpoint(engine, path) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_missing_or_partial_checkpoint_is_named(tiny_model_dir, tmp_path):
    engine = make_engine("actor", tiny_model_dir, 0)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint directory at .*nowhere"):
        load_engine_checkpoint(engine, tmp_path / "nowhere")
    path = save_engine_checkpoint(engine, tmp_path / "ckpt")
    (path / "client_state.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"incomplete: missing \['client_state.json'\]"):
        load_engine_checkpoint(engine, path)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        save_engine_checkpoint(engine, tmp_path / "other", client_state={"x": object()})
    assert not (tmp_path / "other").exists()


def test_zero_stage_mismatch_is_rejected(tiny_model_dir, tmp_path):
    path = save_engine_checkpoint(make_engine("actor", tiny_model_dir, 0), tmp_path / "ckpt")
    with pytest.raises(
        ValueError, match=r"saved with .*=\(1, 0, True\); this engine has \(1, 2, True\)"
    ):
        load_engine_checkpoint(make_engine("actor", tiny_model_dir, 2), path)


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, "a": 3, "b": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_hf_export_reloads_with_identical_outputs(
    tiny_model_dir, tmp_path, make_rollout_batch, zero_stage
):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=3)
    engine = make_engine("actor", tiny_model_dir, zero_stage)
    update("actor", engine, make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=4))
    path = export_hf_model(engine, tmp_path / "hf", tokenizer=tiny_tokenizer())

    exported = AutoModelForCausalLM.from_pretrained(path).eval()
    weights = full_weights(engine)
    for name, tensor in exported.named_parameters():
        torch.testing.assert_close(tensor, weights[f"lm.{name}"], atol=0, rtol=0, msg=name)
    with torch.no_grad():
        via_engine, _ = compute_log_prob(engine, batch, MicroBatching())
        via_export, _ = compute_log_prob(ResponseLogProbModel(exported), batch, MicroBatching())
    torch.testing.assert_close(via_export.batch["old_log_probs"], via_engine.batch["old_log_probs"])
    assert AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("b") == 4
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_critic_export_reloads_as_a_value_model(tiny_model_dir, tmp_path, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=3)
    engine = make_engine("critic", tiny_model_dir, 3)
    update("critic", engine, batch)
    path = export_hf_model(engine, tmp_path / "critic-hf")
    reloaded = ValueModel(load_value_model(path))
    expected = compute_values(engine, batch, MicroBatching()).batch["values"]
    actual = compute_values(reloaded, batch, MicroBatching()).batch["values"]
    torch.testing.assert_close(actual, expected)


def test_export_rejects_an_unknown_module(tmp_path):
    with pytest.raises(TypeError, match="cannot export Linear"):
        export_hf_model(torch.nn.Linear(2, 2), tmp_path / "x")


def test_latest_tracker_and_prune(tmp_path):
    assert read_latest_step(tmp_path) is None
    assert checkpoint_dir(tmp_path, 3, "critic") == tmp_path / "global_step_3" / "critic"
    for step in (1, 2, 3, 5):
        checkpoint_dir(tmp_path, step, "actor").mkdir(parents=True)
    (tmp_path / "unrelated").mkdir()
    write_latest_step(tmp_path, 2)  # e.g. steps 3 and 5 were written by a run that then died
    assert read_latest_step(tmp_path) == 2
    assert (tmp_path / LATEST_FILE).read_text() == "2"
    assert prune_checkpoints(tmp_path, None) == []
    removed = prune_checkpoints(tmp_path, keep_last=1)
    assert removed == [tmp_path / "global_step_1", tmp_path / "global_step_3"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "global_step_2",
        "global_step_5",
        "unrelated",
    ]
    with pytest.raises(ValueError, match="keep_last must be an int ≥ 1"):
        prune_checkpoints(tmp_path, 0)
    (tmp_path / LATEST_FILE).write_text("five")
    with pytest.raises(ValueError, match="non-negative step number, got 'five'"):
        read_latest_step(tmp_path)
    with pytest.raises(ValueError, match="role must be a plain directory name"):
        checkpoint_dir(tmp_path, 1, "../actor")


def test_client_state_is_plain_json(tiny_model_dir, tmp_path):
    path = save_engine_checkpoint(
        make_engine("actor", tiny_model_dir, 1), tmp_path / "ckpt", client_state={"epoch": 2}
    )
    assert json.loads((path / "client_state.json").read_text()) == {"epoch": 2}
    manifest = json.loads((path / "ppoflow_checkpoint.json").read_text())
    assert manifest["zero_stage"] == 1 and manifest["world_size"] == 1
