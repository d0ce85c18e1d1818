"""stages/engines/kv_cache.py: the reserved cache holds what a DynamicLayer holds, writes new
tokens in place, survives the layer operations that replace its tensors, generates what
transformers' own cache generates, and is not used where the model's cache has special layers;
the slot buffers give one static cache per batch size over the same memory, and compaction keeps
the rows it is asked to keep."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.cache_utils import Cache, DynamicLayer

from stages.engines.kv_cache import (
    ReservedLayer,
    SlotBuffers,
    has_plain_attention_layers,
    reserved_cache,
    slot_shapes,
)
from stages.engines.models import load_causal_lm


def states(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, columns, 4, generator=generator), torch.randn(
        rows, 2, columns, 4, generator=generator
    )


def test_a_reserved_layer_holds_what_a_dynamic_layer_holds_and_writes_in_place():
    reserved, dynamic = ReservedLayer(reserve=3), DynamicLayer()
    updates = [states(3, 5, 0), *(states(3, 1, seed) for seed in range(1, 6))]  # past the reserve
    pointers = []
    for keys, values in updates:
        got, want = reserved.update(keys, values), dynamic.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        pointers.append(got[0].data_ptr())
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 10
    assert len(set(pointers[:4])) == 1  # prompt + 3 tokens: one buffer, written in place
    assert pointers[4] != pointers[0]  # the 4th token did not fit: one new buffer


def test_replacing_its_tensors_then_updating_keeps_the_states():
    reserved, dynamic = ReservedLayer(reserve=4), DynamicLayer()
    for layer in (reserved, dynamic):
        layer.update(*states(2, 3, 0))
        layer.batch_select_indices(torch.tensor([1, 1, 0]))
        layer.update(*states(3, 1, 1))
        layer.crop(-1)
        layer.update(*states(3, 1, 2))
    torch.testing.assert_close(reserved.keys, dynamic.keys, rtol=0, atol=0)
    torch.testing.assert_close(reserved.values, dynamic.values, rtol=0, atol=0)


def test_generation_with_it_equals_transformers_own_cache(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir).eval()
    ids = torch.randint(3, 50, (4, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = mask[2, :6] = 0
    config = GenerationConfig(
        max_new_tokens=9, do_sample=False, eos_token_id=[], pad_token_id=0, use_cache=True
    )
    kwargs = dict(output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        own = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **kwargs)
        cache = reserved_cache(model, reserve=9)
        ours = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            past_key_values=cache,
            **kwargs,
        )
    assert all(isinstance(layer, ReservedLayer) for layer in cache.layers)
    assert torch.equal(ours.sequences, own.sequences)
    torch.testing.assert_close(torch.stack(ours.logits), torch.stack(own.logits), rtol=0, atol=0)


def test_a_model_with_sliding_window_layers_keeps_its_own_cache(tmp_path, make_tiny_lm):
    path = make_tiny_lm(tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    sliding = AutoModelForCausalLM.from_pretrained(path)
    assert "sliding_attention" in sliding.config.layer_types
    assert reserved_cache(sliding, reserve=8) is None
    assert not has_plain_attention_layers(sliding)


def test_slot_buffers_update_in_place_at_every_batch_size_and_compact_the_kept_rows():
    dynamic = DynamicLayer()
    dynamic.update(*states(3, 2, 0))  # a prefill of 3 distinct prompts, 2 columns
    prefill = Cache(layers=[dynamic])
    assert slot_shapes(prefill) == [(2, 4, 4)]
    buffers = SlotBuffers([(2, 4, 4)], rows=5, capacity=6, dtype=torch.float32, device="cpu")
    buffers.fill(prefill, row_of=torch.tensor([0, 0, 1, 2, 2]), offset=1)  # columns 1, 2
    full = buffers.cache(5)
    assert full is buffers.cache(5) and full.is_compileable
    assert int(full.get_seq_length()) == 3 and full.get_max_cache_shape() == 6
    keys, values = states(5, 1, 1)
    got_keys, _ = full.update(keys, values, layer_idx=0)
    assert got_keys.data_ptr() == buffers.keys[0].data_ptr()  # written in place, column 3
    torch.testing.assert_close(buffers.keys[0][:, :, 3:4], keys, rtol=0, atol=0)
    torch.testing.assert_close(buffers.keys[0][3, :, 1:3], dynamic.keys[2], rtol=0, atol=0)
    before = buffers.keys[0].clone()
    buffers.compact(torch.tensor([4, 1]))
    small = buffers.cache(2)
    assert small.layers[0].keys.shape == (2, 2, 6, 4) and int(small.get_seq_length()) == 4
    torch.testing.assert_close(small.layers[0].keys[:, :, :4], before[[4, 1], :, :4])
    small.update(*states(2, 1, 2), layer_idx=0)  # the shared counter: column 4 next
    assert int(full.get_seq_length()) == int(small.get_seq_length()) == 5
