"""pad_dataproto_to_divisor / unpad_dataproto / DataProto.padding and the auto-padding switch."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dataproto import DataProto, DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto


def rows(n: int, **kwargs) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n)},
        {"uid": np.array([f"p{i}" for i in range(n)], dtype=object)},
        **kwargs,
    )


@pytest.fixture
def global_padding_off(monkeypatch):
    monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    DataProtoConfig.auto_padding = False
    yield
    DataProtoConfig.auto_padding = False


def test_pad_cycles_from_row_zero():
    padded, pad_size = pad_dataproto_to_divisor(rows(3), 8)
    assert pad_size == 5
    assert padded.batch["x"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert padded.non_tensor_batch["uid"].tolist() == [
        "p0",
        "p1",
        "p2",
        "p0",
        "p1",
        "p2",
        "p0",
        "p1",
    ]


def test_pad_when_divisible_returns_same_object():
    data = rows(4)
    padded, pad_size = pad_dataproto_to_divisor(data, 2)
    assert padded is data and pad_size == 0


def test_pad_empty_warns_and_pads_nothing(caplog):
    data = rows(0)
    with caplog.at_level(logging.WARNING):
        padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert padded is data and pad_size == 0 and "no rows" in caplog.text


def test_pad_then_unpad_restores_rows_and_pad_keeps_subclass():
    class MyProto(DataProto):
        pass

    data = MyProto.from_dict({"x": torch.arange(5)})
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert type(padded) is MyProto and len(padded) == 8 and pad_size == 3
    assert unpad_dataproto(padded, pad_size).batch["x"].tolist() == [0, 1, 2, 3, 4]
    assert unpad_dataproto(data, 0) is data


def test_pad_and_unpad_argument_errors():
    with pytest.raises(ValueError, match="size_divisor must be > 0, got 0"):
        pad_dataproto_to_divisor(rows(3), 0)
    with pytest.raises(ValueError, match="pad_size 4 exceeds the DataProto's 3 rows"):
        unpad_dataproto(rows(3), 4)
    with pytest.raises(ValueError, match="pad_size must be >= 0, got -1"):
        unpad_dataproto(rows(3), -1)


def test_padding_method_appends_last_or_first_row_in_place():
    data = rows(3, meta_info={"t": 1})
    meta = data.meta_info
    data.padding(2)
    assert data.batch["x"].tolist() == [0, 1, 2, 2, 2]
    assert data.non_tensor_batch["uid"].tolist()[-1] == "p2"
    data.padding(1, padding_candidate="first")
    assert data.batch["x"].tolist()[-1] == 0
    assert data.meta_info is meta and data.meta_info == {"t": 1}
    data.padding(0)
    assert len(data) == 6
    with pytest.raises(ValueError, match="padding_candidate must be"):
        data.padding(1, padding_candidate="middle")


def test_global_switch_enables_uneven_chunk(global_padding_off):
    data = rows(10)
    with pytest.raises(ValueError, match="10 rows do not split into 4"):
        data.chunk(4)
    DataProtoConfig.auto_padding = True
    assert data.is_padding_enabled()
    assert [len(p) for p in data.chunk(4)] == [3, 3, 3, 1]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True"])
def test_env_variable_enables_auto_padding(monkeypatch, global_padding_off, value):
    monkeypatch.setenv("VERL_AUTO_PADDING", value)
    assert DataProtoConfig.auto_padding and rows(2).is_padding_enabled()


def test_env_variable_other_values_leave_it_off(monkeypatch, global_padding_off):
    monkeypatch.setenv("VERL_AUTO_PADDING", "yes")
    assert not DataProtoConfig.auto_padding and not rows(2).is_padding_enabled()


def test_auto_padding_setter_requires_a_bool(global_padding_off):
    with pytest.raises(TypeError, match="must be a bool, got 1"):
        DataProtoConfig.auto_padding = 1
    assert DataProtoConfig.auto_padding is False
