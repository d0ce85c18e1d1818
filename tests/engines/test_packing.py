"""Packed forwards (``use_remove_padding``, stages/engines/packing.py): the rows' real tokens back
to back give the log-probs, entropy, values and gradients of the padded forward (fp32, 1e-5) for
the actor, the critic, the reference policy and a ZeRO-3 engine; token-budget micro-batches run
on their real tokens; malformed rows are refused by name."""

from __future__ import annotations

import itertools
from pathlib import Path

import deepspeed
import pytest
import torch

from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.attention import LOADED_AS
from stages.engines.batching import MicroBatching
from stages.engines.critic import ValueModel, compute_values, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel, response_logprobs
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.packing import PACKED_LAYOUTS, PackedLayout, pack_rows, packed_layout
from stages.engines.roles import RefWorker

REPO = Path(__file__).resolve().parents[2]
# prompt and response lengths that vary, one row without a response token
PROMPTS, RESPONSES, P, R = [3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], 5, 4
ACTOR_LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
CRITIC_LOSS = {"cliprange_value": 0.5, "loss_agg_mode": "token-mean"}


def decoder_inputs(decoder) -> list[torch.Tensor]:
    """Records the ``input_ids`` of every forward of ``decoder``."""
    seen: list[torch.Tensor] = []
    decoder.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs["input_ids"]), with_kwargs=True
    )
    return seen


def test_rows_are_packed_first_fit_with_their_own_positions(make_rollout_batch):
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    packed = pack_rows(
        t["input_ids"], t["attention_mask"], t["position_ids"], R, PackedLayout(False)
    )
    lengths = [p + r for p, r in zip(PROMPTS, RESPONSES)]  # 7 7 2 7 6 5 6 5 = 45 real tokens
    assert packed.input_ids.shape == (7, 7)  # first fit by length in rows of the longest, 7
    real_ids = t["input_ids"][t["attention_mask"].bool()]
    assert sorted(packed.input_ids[packed.input_ids != 0].tolist()) == sorted(real_ids.tolist())
    assert sorted(packed.input_ids.ne(0).sum(1).tolist()) == sorted([7, 7, 7, 6, 6, 7, 5])
    for row, positions in zip(packed.input_ids, packed.position_ids):
        used = positions[row != 0].tolist()  # runs that count 0, 1, … one sequence each
        assert used[0] == 0 and all(b in (a + 1, 0) for a, b in itertools.pairwise(used))
    assert torch.equal(packed.real, t["response_mask"].bool())  # R' = R = 4 here
    one_row = pack_rows(
        t["input_ids"],
        t["attention_mask"],
        t["position_ids"],
        R,
        PACKED_LAYOUTS["flash_attention_2"],
    )
    assert one_row.input_ids.shape == (1, sum(lengths))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("one_row", [False, True], ids=["rows", "one-row"])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded(
    tiny_model_dir, make_rollout_batch, attn, one_row, monkeypatch
):
    loaded = LOADED_AS.get(attn, attn)  # the config's sdpa loads ppoflow's
    monkeypatch.setitem(PACKED_LAYOUTS, loaded, PackedLayout(one_row=one_row))
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    real = t["response_mask"].bool()
    results = []
    for layout in ("full", "packed"):
        model = load_causal_lm(tiny_model_dir, attn_implementation=attn)
        seen = decoder_inputs(model.get_decoder())
        logprobs, entropy = response_logprobs(
            model, t["input_ids"], t["attention_mask"], t["position_ids"], R,
            temperature=0.7, calculate_entropy=True, layout=layout,
        )  # fmt: skip
        (logprobs * real).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs, entropy, grads, seen[0].numel()))
    (lp_full, ent_full, grads_full, full_tokens), (lp, ent, grads, packed_tokens) = results
    assert packed_tokens < full_tokens  # 49 or 45 slots against 8 × 9
    torch.testing.assert_close(lp[real], lp_full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[real], ent_full[real], atol=1e-5, rtol=1e-5)
    assert (lp[~real] == 0).all() and (ent[~real] == 0).all()  # no real token there
    assert grads.keys() == grads_full.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_full[name], atol=1e-5, rtol=1e-4, msg=name)


def actor_after_update(model_dir, zero_stage, layout, batch, micro):
    torch.manual_seed(0)
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(model_dir), layout),
        EngineSettings(zero_stage=zero_stage, lr=1e-2, eps=1e-3, clip_grad=1.0),
    )
    log_probs, _ = compute_log_prob(engine, batch, micro)
    settings = PPOUpdateSettings(mini_batch_size=4, epochs=1, micro=micro)
    metrics = update_actor(engine, batch, settings, ACTOR_LOSS)
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):  # full tensors under ZeRO-3
        weights = {n: p.detach().clone() for n, p in params.items()}
    return log_probs.batch["old_log_probs"], weights, metrics


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_actor_log_probs_and_update_packed_equal_the_padded(
    tiny_model_dir, make_rollout_batch, zero_stage
):
    batch = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=1)
    micro = MicroBatching(micro_batch_size=3)
    lp_full, full, full_metrics = actor_after_update(
        tiny_model_dir, zero_stage, "full", batch, micro
    )
    lp, packed, metrics = actor_after_update(tiny_model_dir, zero_stage, "packed", batch, micro)
    real = batch.batch["response_mask"].bool()
    torch.testing.assert_close(lp[real], lp_full[real], atol=1e-5, rtol=1e-5)
    for name in full:
        torch.testing.assert_close(packed[name], full[name], atol=2e-6, rtol=1e-5, msg=name)
    assert metrics["actor/pg_loss"].aggregate() == pytest.approx(
        full_metrics["actor/pg_loss"].aggregate(), abs=1e-5
    )


def critic_after_update(model_dir, zero_stage, layout, batch):
    torch.manual_seed(0)  # the value head is freshly initialised
    engine = initialize_engine(
        ValueModel(load_value_model(model_dir), layout),
        EngineSettings(zero_stage=zero_stage, lr=1e-2, eps=1e-3, clip_grad=1.0),
    )
    values = compute_values(engine, batch, MicroBatching(micro_batch_size=3)).batch["values"]
    settings = PPOUpdateSettings(mini_batch_size=4, epochs=1, micro=MicroBatching(3))
    metrics = update_critic(engine, batch, settings, CRITIC_LOSS)
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        weights = {n: p.detach().clone() for n, p in params.items()}
    return values, weights, metrics


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_critic_values_and_update_packed_equal_the_padded(
    tiny_model_dir, make_rollout_batch, zero_stage
):
    batch = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=2)
    v_full, full, full_metrics = critic_after_update(tiny_model_dir, zero_stage, "full", batch)
    values, packed, metrics = critic_after_update(tiny_model_dir, zero_stage, "packed", batch)
    real = batch.batch["response_mask"].bool()
    torch.testing.assert_close(values[real], v_full[real], atol=1e-5, rtol=1e-5)
    assert (values[~real] == 0).all()
    for name in full:
        torch.testing.assert_close(packed[name], full[name], atol=2e-6, rtol=1e-5, msg=name)
    assert metrics["critic/vf_loss"].aggregate() == pytest.approx(
        full_metrics["critic/vf_loss"].aggregate(), abs=1e-5
    )


def test_reference_policy_packed_equals_the_padded(tmp_path, make_rollout_batch):
    model_dir = make_tiny_model(tmp_path / "model")
    batch = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=3)
    batch.meta_info["temperature"] = 1.0
    results = {}
    for packed in (True, False):
        config = load_config(
            REPO / "configs" / "demo-cpu.yaml",
            [
                f"actor_rollout_ref.model.path={model_dir}",
                f"actor_rollout_ref.model.use_remove_padding={packed}",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
            ],
        )
        worker = RefWorker(config)
        module = getattr(worker.model, "module", worker.model)  # an engine, or the plain module
        assert module.layout == ("packed" if packed else "trimmed")
        results[packed] = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
    real = batch.batch["response_mask"].bool()
    torch.testing.assert_close(results[True][real], results[False][real], atol=1e-5, rtol=1e-5)


def test_token_budget_micro_batches_run_on_their_real_tokens(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=4)
    micro = MicroBatching(use_dynamic_bsz=True, max_token_len=12)
    model = load_causal_lm(tiny_model_dir).eval()
    seen = decoder_inputs(model.get_decoder())
    packed, _ = compute_log_prob(ResponseLogProbModel(model, "packed"), batch, micro)
    plan = micro.plan(batch.batch["attention_mask"])
    assert len(seen) == len(plan) > 1
    lengths = batch.batch["attention_mask"].sum(1)
    for ids, rows in zip(seen, plan):
        assert int((ids != 0).sum()) == int(lengths[rows].sum()) <= 12  # the budget, real tokens
        assert ids.shape[1] == int(lengths[rows].max())  # packed rows as wide as the longest
    trimmed, _ = compute_log_prob(ResponseLogProbModel(model, "trimmed"), batch, micro)
    slots = sum(ids.numel() for ids in seen[: len(plan)])
    trimmed_slots = sum(ids.numel() for ids in seen[len(plan) :])
    assert slots < trimmed_slots
    real = batch.batch["response_mask"].bool()
    torch.testing.assert_close(
        packed.batch["old_log_probs"][real],
        trimmed.batch["old_log_probs"][real],
        atol=1e-5,
        rtol=1e-5,
    )


def test_rows_that_cannot_be_packed_are_refused_by_name(make_rollout_batch, tiny_model_dir):
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    gapped = t["attention_mask"].clone()
    gapped[0, P] = 0  # a hole inside row 0's run
    with pytest.raises(ValueError, match=r"one run .* has a gap; set use_remove_padding=false"):
        pack_rows(t["input_ids"], gapped, t["position_ids"], R, PackedLayout(False))
    shifted = t["position_ids"] + 1
    with pytest.raises(ValueError, match=r"position ids 0, 1, … over each row's real tokens"):
        pack_rows(t["input_ids"], t["attention_mask"], shifted, R, PackedLayout(False))
    with pytest.raises(ValueError, match="multi-axis position ids are not supported"):
        pack_rows(
            t["input_ids"], t["attention_mask"], t["position_ids"][None].expand(3, -1, -1), R,
            PackedLayout(False),
        )  # fmt: skip
    model = load_causal_lm(tiny_model_dir)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match=r"do not support attn_implementation 'flex_attention'"):
        packed_layout(model)


def test_a_batch_without_padding_packs_into_its_own_rows(tiny_model_dir, make_rollout_batch):
    t = make_rollout_batch([P] * 3, [R] * 3, P, R).batch  # every row full width
    packed = pack_rows(
        t["input_ids"], t["attention_mask"], t["position_ids"], R, PackedLayout(False)
    )
    assert torch.equal(packed.input_ids, t["input_ids"])
    model = load_causal_lm(tiny_model_dir)
    a, _ = response_logprobs(model, t["input_ids"], t["attention_mask"], t["position_ids"], R)
    b, _ = response_logprobs(
        model, t["input_ids"], t["attention_mask"], t["position_ids"], R, layout="packed"
    )
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
