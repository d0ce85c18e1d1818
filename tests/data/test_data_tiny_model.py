"""The tiny tokenizer and causal LM: built offline, saved, reloaded by path like any HF model."""

from __future__ import annotations

import json

import pytest
import torch

from stages.data.tiny_model import MIN_HEAD_DIM, load_causal_lm, make_tiny_model, tiny_model_config
from stages.data.tokenizer import (
    BYTE_OFFSET,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    build_tiny_tokenizer,
    load_tokenizer,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3)


def test_tokenizer_vocab_specials_and_byte_round_trip(tiny_tokenizer):
    assert len(tiny_tokenizer) == BYTE_OFFSET + 256 < 1000
    assert tiny_tokenizer.pad_token == PAD_TOKEN and tiny_tokenizer.eos_token == EOS_TOKEN
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id
    text = "copy: ab\n€é"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == [BYTE_OFFSET + b for b in text.encode()]
    assert tiny_tokenizer.decode(ids) == text
    with_eos = [*ids, tiny_tokenizer.eos_token_id]
    assert tiny_tokenizer.decode(with_eos, skip_special_tokens=True) == text


def test_tokenizer_saved_and_reloaded_offline(tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "copy: c"}]
    original = tiny_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    again = loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert original == again == "<|user|>copy: c<|assistant|>"
    assert loaded.chat_template == CHAT_TEMPLATE
    assert (
        loaded(again, add_special_tokens=False)["input_ids"]
        == tiny_tokenizer(again, add_special_tokens=False)["input_ids"]
    )
    assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 1)


def test_model_directory_reloads_with_identical_logits(model_dir):
    model = load_causal_lm(model_dir)
    again = load_causal_lm(model_dir)
    tokenizer = load_tokenizer(model_dir)
    ids = torch.tensor(
        [tokenizer("<|user|>copy: c<|assistant|>", add_special_tokens=False)["input_ids"]]
    )
    with torch.no_grad():
        logits = model(ids).logits
        assert torch.equal(logits, again(ids).logits)
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_model_config_and_generation_config(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] >= MIN_HEAD_DIM
    assert config["num_key_value_heads"] == 2 and config["num_hidden_layers"] == 2
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == BYTE_OFFSET + 256
    assert config["max_position_embeddings"] >= 256
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (1, 0)
    assert (model_dir / "model.safetensors").exists()


def test_same_seed_same_weights_other_seed_differs(tmp_path, model_dir):
    same = make_tiny_model(tmp_path / "same", seed=3)
    other = make_tiny_model(tmp_path / "other", seed=4)
    read = lambda d: (d / "model.safetensors").read_bytes()  # noqa: E731
    assert read(same) == read(model_dir)
    assert read(other) != read(model_dir)


def test_generate_stops_and_pads_with_the_configured_ids(model_dir):
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    ids = torch.tensor([tokenizer("<|user|>a<|assistant|>", add_special_tokens=False)["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True)
    assert out.shape[1] <= ids.shape[1] + 4
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_head_dim_below_32_is_rejected():
    with pytest.raises(ValueError, match="head_dim >= 32"):
        tiny_model_config(build_tiny_tokenizer(), hidden_size=64, num_heads=4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tiny_model_config(build_tiny_tokenizer(), num_heads=4, num_kv_heads=3)
