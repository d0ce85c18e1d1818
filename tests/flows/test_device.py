"""trainer.device is applied before any engine: 'cuda' needs CUDA, 'cpu' hides it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from flows.process.device import apply_device


def config(device: str) -> SimpleNamespace:
    return SimpleNamespace(trainer=SimpleNamespace(device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_is_refused_naming_the_key():
    with pytest.raises(RuntimeError, match=r"trainer.device = 'cuda' but torch sees no CUDA"):
        apply_device(config("cuda"))


def test_cuda_with_a_device_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert apply_device(config("cuda")) == "cuda"


def test_cpu_hides_cuda_from_this_process_and_its_children(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert apply_device(config("cpu")) == "cpu"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_cpu_after_cuda_was_initialized_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES= \\(empty\\)"):
        apply_device(config("cpu"))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
