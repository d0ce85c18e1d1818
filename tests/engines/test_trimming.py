"""Forwards run at the width their rows need: the same log-probs, values, gradients and greedy
tokens as at the full ``P + R`` width (stages/engines/trimming.py)."""

from __future__ import annotations

import torch

from stages.engines.critic import ValueModel
from stages.engines.logprob import response_logprobs
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.rollout_hf import SamplingSettings, _generate_rows
from stages.engines.trimming import real_span

# short prompts and answers in wide columns: 2 leading and 3 trailing columns are padding in
# every row
PROMPTS, RESPONSES, P, R = [3, 5, 4, 2], [2, 4, 0, 3], 7, 7


def forward_widths(model) -> list[int]:
    """Records the sequence width of every decoder forward."""
    widths: list[int] = []
    model.get_decoder().register_forward_pre_hook(
        lambda _module, _args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True,
    )
    return widths


def test_the_span_covers_exactly_the_used_columns(make_rollout_batch):
    batch = make_rollout_batch(PROMPTS, RESPONSES, P, R)
    assert real_span(batch.batch["attention_mask"], R) == (P - 5, P + 4)


def test_log_probs_entropy_and_gradients_equal_the_full_width(tiny_model_dir, make_rollout_batch):
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    real = t["response_mask"].bool()
    args = (t["input_ids"], t["attention_mask"], t["position_ids"], R)
    results = []
    for layout in ("trimmed", "full"):
        torch.manual_seed(0)
        model = load_causal_lm(tiny_model_dir)
        widths = forward_widths(model)
        logprobs, entropy = response_logprobs(
            model, *args, temperature=0.7, calculate_entropy=True, layout=layout
        )
        (logprobs * real).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs, entropy, grads, widths))
    (lp, ent, grads, widths), (lp_full, ent_full, grads_full, widths_full) = results
    assert widths == [9] and widths_full == [P + R]  # 14 columns → 9
    torch.testing.assert_close(lp[real], lp_full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[real], ent_full[real], atol=1e-5, rtol=1e-5)
    assert lp.shape == (len(PROMPTS), R) and (lp[:, 4:] == 0).all()  # trimmed columns: 0
    assert grads.keys() == grads_full.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_full[name], atol=1e-5, rtol=1e-4)


def test_critic_values_equal_the_full_width(tiny_model_dir, make_rollout_batch):
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    real = t["response_mask"].bool()
    model = ValueModel(load_value_model(tiny_model_dir)).eval()
    with torch.no_grad():
        values = model(t["input_ids"], t["attention_mask"], t["position_ids"], R)
        hidden = model.backbone.base_model(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).last_hidden_state[:, -R - 1 : -1]  # fmt: skip
        full = model.backbone.score(hidden).squeeze(-1).float()
    torch.testing.assert_close(values[real], full[real], atol=1e-5, rtol=1e-5)


def test_greedy_generation_is_unchanged_by_dropping_prompt_padding(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir).eval()
    t = make_prompts([3, 5, 2], width=9)
    settings = SamplingSettings(response_length=6, eos_token_id=2, pad_token_id=0, do_sample=False)
    widths = forward_widths(model)
    with torch.no_grad():
        responses, _ = _generate_rows(model, t["input_ids"], t["attention_mask"], settings)
        full = model.generate(
            input_ids=t["input_ids"], attention_mask=t["attention_mask"],
            generation_config=settings.generation_config(),
        )[:, 9:]  # fmt: skip
    assert widths[0] == 5  # the first forward saw the 5 used prompt columns, not 9
    full = torch.nn.functional.pad(full, (0, 6 - full.shape[1]), value=0)
    assert torch.equal(responses, full)


def make_prompts(lengths: list[int], width: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
