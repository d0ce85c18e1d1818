"""stages/engines/attention.py: the config's ``sdpa`` loads ppoflow's SDPA attention, which gives
transformers' SDPA output and gradients on a grouped-query model (padded, packed, generating
with a dynamic or static cache), delegates where it does not apply, and leaves no trace in a
saved model directory."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from stages.engines import attention
from stages.engines.attention import PPOFLOW_SDPA, transformers_attention
from stages.engines.models import load_causal_lm

MAX_ID = 50  # token ids drawn below the tiny model's vocabulary


def both(path):
    """(ppoflow's load, transformers' own sdpa load) of the same weights, caches off as ours."""
    ours = load_causal_lm(path)
    theirs = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    theirs.config.use_cache = False
    return ours, theirs


def left_padded(rows: int = 4, width: int = 12):
    ids = torch.randint(3, MAX_ID, (rows, width), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(rows, width, dtype=torch.long)
    for row, pad in enumerate([0, 3, 7, 11][:rows]):
        mask[row, :pad] = 0
    return ids.masked_fill(mask == 0, 0), mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_config_sdpa_loads_ppoflows_attention_and_other_names_are_kept():
    assert transformers_attention("sdpa") == PPOFLOW_SDPA
    assert transformers_attention("eager") == "eager"
    assert transformers_attention("flash_attention_2") == "flash_attention_2"


def test_padded_forward_and_gradients_equal_transformers_sdpa(tiny_model_dir):
    ours, theirs = both(tiny_model_dir)
    assert ours.config._attn_implementation == PPOFLOW_SDPA
    ids, mask, positions = left_padded()
    logits = [
        m(input_ids=ids, attention_mask=mask, position_ids=positions).logits for m in (ours, theirs)
    ]
    real = mask.bool()
    torch.testing.assert_close(logits[0][real], logits[1][real], atol=1e-6, rtol=1e-6)
    for out in logits:
        torch.log_softmax(out[real], -1)[:, 5].sum().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_packed_rows_equal_transformers_sdpa_and_each_sequence_alone(tiny_model_dir):
    ours, theirs = both(tiny_model_dir)
    ids = torch.randint(3, MAX_ID, (1, 20), generator=torch.Generator().manual_seed(2))
    positions = torch.cat([torch.arange(7), torch.arange(13)])[None]
    with torch.no_grad():
        packed = ours(input_ids=ids, position_ids=positions).logits
        reference = theirs(input_ids=ids, position_ids=positions).logits
        alone = torch.cat([ours(input_ids=ids[:, :7]).logits, ours(input_ids=ids[:, 7:]).logits], 1)
    torch.testing.assert_close(packed, reference, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cache", [None, "static"])
def test_greedy_generation_equals_transformers_sdpa(tiny_model_dir, cache):
    ours, theirs = both(tiny_model_dir)
    ids, mask, _ = left_padded()
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=[])
    kwargs.update(use_cache=True, output_logits=True, return_dict_in_generate=True)
    if cache is not None:
        kwargs["cache_implementation"] = cache
    with torch.no_grad():
        out = [m.generate(input_ids=ids, attention_mask=mask, **kwargs) for m in (ours, theirs)]
    assert torch.equal(out[0].sequences, out[1].sequences)
    logits = [torch.stack(o.logits) for o in out]
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_without_grouping_it_is_transformers_function(tmp_path, monkeypatch, make_tiny_lm):
    calls = []
    from transformers.integrations import sdpa_attention as hf

    original = hf.sdpa_attention_forward

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf, "sdpa_attention_forward", counted)
    plain = load_causal_lm(make_tiny_lm(tmp_path, num_key_value_heads=2))
    ids, mask, positions = left_padded(rows=2)
    with torch.no_grad():
        plain(input_ids=ids, attention_mask=mask, position_ids=positions)
    assert len(calls) == 2  # one per layer: groups of 1 go to transformers' own function


def test_grouped_cpu_calls_do_not_go_through_transformers_repeat(tiny_model_dir, monkeypatch):
    from transformers.integrations import sdpa_attention as hf

    monkeypatch.setattr(hf, "repeat_kv", lambda *a, **k: pytest.fail("K/V heads were copied"))
    model = load_causal_lm(tiny_model_dir)
    ids, mask, positions = left_padded(rows=2)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions)
    assert attention.LOADED_AS["sdpa"] == model.config._attn_implementation


def test_a_saved_model_records_no_attention_implementation(tiny_model_dir, tmp_path):
    load_causal_lm(tiny_model_dir).save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert not [key for key in config if "attn" in key]
