"""Schema: layers, dtypes, shapes, token-axis inference and the JSON round trip."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto.protocol import DataProto
from dataproto.schema import KeySchema, format_schema, schema_from_json, schema_of, schema_to_json


def _batch(rows: int = 3, prompt: int = 4, response: int = 5) -> DataProto:
    seq = prompt + response
    td = TensorDict(
        {
            "input_ids": torch.zeros(rows, seq, dtype=torch.long),
            "attention_mask": torch.ones(rows, seq, dtype=torch.long),
            "prompts": torch.zeros(rows, prompt, dtype=torch.long),
            "responses": torch.zeros(rows, response, dtype=torch.long),
            "old_log_probs": torch.zeros(rows, response, dtype=torch.bfloat16),
            "custom_response_tensor": torch.zeros(rows, response, 2),
            "custom_other_width": torch.zeros(rows, response + 1),
            "reward_baselines": torch.zeros(rows),
        },
        batch_size=[rows],
    )
    non_tensor = {
        "uid": np.array([f"u{i}" for i in range(rows)], dtype=object),
        "score": np.arange(rows, dtype=np.float64),
    }
    return DataProto(batch=td, non_tensor_batch=non_tensor, meta_info={"temperature": 1.0})


def test_schema_layers_dtypes_shapes_and_token_axes():
    by_name = {k.name: k for k in schema_of(_batch())}
    assert by_name["input_ids"] == KeySchema("input_ids", "batch", "int64", (3, 9), "sequence")
    assert by_name["prompts"].token_axis == "sequence"
    assert by_name["old_log_probs"] == KeySchema(
        "old_log_probs", "batch", "bfloat16", (3, 5), "response"
    )
    # unknown keys: response axis inferred from the width of `responses`, otherwise None
    assert by_name["custom_response_tensor"].token_axis == "response"
    assert by_name["custom_other_width"].token_axis is None
    assert by_name["reward_baselines"].token_axis is None
    assert by_name["uid"] == KeySchema("uid", "non_tensor_batch", "object", (3,), None)
    assert by_name["score"].dtype == "float64"


def test_unknown_key_without_responses_has_no_token_axis():
    td = TensorDict({"x": torch.zeros(2, 5)}, batch_size=[2])
    assert schema_of(DataProto(batch=td)) == [KeySchema("x", "batch", "float32", (2, 5), None)]


def test_schema_of_batch_none_and_empty():
    nt = {"uid": np.array(["a"], dtype=object)}
    assert [k.name for k in schema_of(DataProto(batch=None, non_tensor_batch=nt))] == ["uid"]
    assert schema_of(DataProto()) == []


def test_schema_order_is_batch_then_non_tensor_sorted():
    names = [k.name for k in schema_of(_batch())]
    assert names[-2:] == ["score", "uid"]
    assert names[:-2] == sorted(names[:-2])


def test_json_round_trip_through_text():
    schema = schema_of(_batch())
    assert schema_from_json(json.dumps(schema_to_json(schema))) == schema
    assert schema_from_json(schema_to_json(schema)) == schema


def test_from_json_rejects_bad_records():
    with pytest.raises(ValueError, match="schema record 0"):
        schema_from_json([{"name": "x"}])
    with pytest.raises(ValueError, match="layer 'tensor'"):
        schema_from_json(
            [{"name": "x", "layer": "tensor", "dtype": "f", "shape": [1], "token_axis": None}]
        )
    with pytest.raises(TypeError, match="list of dicts"):
        schema_from_json('{"a": 1}')


def test_non_array_non_tensor_value_is_named():
    # a duck-typed holder: DataProto's own consistency check would reject the list first
    dp = SimpleNamespace(batch=None, non_tensor_batch={"uid": ["a"]})
    with pytest.raises(TypeError, match="'uid'"):
        schema_of(dp)


def test_format_schema_lists_every_key():
    text = format_schema(schema_of(_batch()))
    for name in ("input_ids", "old_log_probs", "uid", "bfloat16", "(3, 9)", "sequence"):
        assert name in text
