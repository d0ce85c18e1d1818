"""Padded rows are stored trimmed and loaded back bit for bit (dataproto/trimmed_rows.py)."""

from __future__ import annotations

import json

import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import ArtifactError, load_artifact, save_artifact, verify_artifact
from dataproto.report import describe_artifact
from dataproto.trimmed_rows import SPANS_SUFFIX, restore_rows, trim_rows

from .test_compact_dtypes import header, rewrite_manifest

P, R, ROWS = 12, 10, 6
PROMPTS, RESPONSES = [3, 12, 1, 5, 7, 2], [10, 4, 0, 1, 6, 9]


def padded_rollout(pad: int = 7) -> DataProto:
    """verl's layout: prompts left-padded with ``pad``, responses right-padded, masked log-probs."""
    generator = torch.Generator().manual_seed(0)
    columns = torch.arange(P + R)
    prompt = torch.tensor(PROMPTS)[:, None]
    response = torch.tensor(RESPONSES)[:, None]
    mask = ((columns >= P - prompt) & (columns < P + response)).long()
    ids = torch.randint(100, 50_000, (ROWS, P + R), generator=generator).masked_fill(mask == 0, pad)
    response_mask = mask[:, P:]
    log_probs = -torch.rand(ROWS, R, generator=generator) * response_mask
    log_probs[0, 3] = -0.0  # a negative zero inside a row must come back as −0.0
    log_probs[1, 1] = float("nan")
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "responses": ids[:, P:],
            "response_mask": response_mask.bool(),
            "old_log_probs": log_probs,
            "advantages": torch.zeros(ROWS, R),  # all padding: nothing stored
            "values": torch.randn(ROWS, R, generator=generator),  # no padding: stored dense
        }
    )


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(width), b.view(width))


@pytest.mark.parametrize("verify", ["full", "lazy"])
def test_a_load_returns_the_padded_tensors_bit_for_bit_but_padding_zeros_signs(tmp_path, verify):
    data = padded_rollout()
    save_artifact(data, tmp_path / "a")
    loaded = load_artifact(tmp_path / "a", verify=verify)
    padding = ~data.batch["response_mask"]
    for key, tensor in data.batch.items():
        expected = tensor
        if tensor.is_floating_point():  # padding zeros come back as +0.0, real −0.0 as −0.0
            expected = tensor.masked_fill(padding & (tensor == 0), 0.0)
        assert bits_equal(loaded.batch[key], expected), key
    assert str(loaded.batch["old_log_probs"][0, 3].item()) == "-0.0"
    verify_artifact(tmp_path / "a")


def test_the_file_holds_each_rows_span_and_the_manifest_names_the_fill(tmp_path):
    save_artifact(padded_rollout(pad=7), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    trimmed = manifest["batch"]["trimmed"]
    real_tokens = sum(PROMPTS) + sum(RESPONSES)
    assert trimmed["input_ids"] == {"fill": 7, "count": real_tokens}
    assert trimmed["attention_mask"] == {"fill": 0, "count": real_tokens}
    assert trimmed["advantages"] == {"fill": 0, "count": 0}
    assert "values" not in trimmed  # nothing to leave off
    assert manifest["batch"]["keys"] == list(padded_rollout().batch.keys())
    found = header(tmp_path / "a")
    assert found["input_ids"]["shape"] == [real_tokens] and found["input_ids"]["dtype"] == "U16"
    assert found["input_ids" + SPANS_SUFFIX]["shape"] == [ROWS, 2]
    assert found["values"]["shape"] == [ROWS, R]
    text = describe_artifact(tmp_path / "a")
    assert f"input_ids {real_tokens}/{ROWS * (P + R)}" in text and "padded again on load" in text
    assert SPANS_SUFFIX not in text


def test_trim_false_stores_every_tensor_dense(tmp_path):
    data = padded_rollout()
    trimmed = save_artifact(data, tmp_path / "t")
    dense = save_artifact(data, tmp_path / "d", trim=False)
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["batch"]["trimmed"] == {}
    assert dense.nbytes > trimmed.nbytes
    assert trimmed.fingerprint == save_artifact(data, tmp_path / "again").fingerprint
    assert trimmed.fingerprint != dense.fingerprint


def test_rows_all_fill_full_rows_and_interior_fill():
    t = torch.tensor([[4, 4, 4], [1, 2, 3], [4, 5, 4]])
    result = trim_rows(t)  # fill 4: the value rows start or end with most often
    assert result.fill == 4 and result.spans.tolist() == [[0, 0], [0, 3], [1, 2]]
    assert result.values.tolist() == [1, 2, 3, 5]
    wide = torch.full((8, 16), 4)
    wide[1, 2:5] = torch.tensor([1, 4, 2])  # a fill value inside a span is kept
    result = trim_rows(wide)
    assert result.spans.tolist()[:2] == [[0, 0], [2, 5]] and result.values.tolist() == [1, 4, 2]
    assert torch.equal(restore_rows(result.values, result.spans, result.fill, (8, 16)), wide)
    dense = torch.arange(16).view(2, 8)  # nothing to leave off: kept dense
    assert trim_rows(dense) is None
    assert trim_rows(torch.zeros(5)) is None and trim_rows(torch.zeros(3, 1)) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["batch"]["trimmed"].update(responses={"fill": 0}), "batch.trimmed"),
        (lambda m: m["batch"]["trimmed"].update(nope={"fill": 0, "count": 1}), "batch.trimmed"),
        (lambda m: m["batch"]["trimmed"]["responses"].update(count=10**6), "batch.trimmed"),
        (lambda m: m["batch"].update(trimmed=["responses"]), "batch.trimmed"),
    ],
    ids=["no-count", "unknown-key", "count-too-large", "not-a-mapping"],
)
def test_a_manifest_with_a_bad_trimmed_entry_is_named(tmp_path, change, message):
    save_artifact(padded_rollout(), tmp_path / "a")
    rewrite_manifest(tmp_path / "a", change)
    with pytest.raises(ArtifactError, match=r"manifest\.json: " + message.replace(".", r"\.")):
        load_artifact(tmp_path / "a", verify="lazy")


def test_spans_that_disagree_with_the_file_are_named(tmp_path):
    data = padded_rollout()
    save_artifact(data, tmp_path / "a")
    count = json.loads((tmp_path / "a" / "manifest.json").read_text())["batch"]["trimmed"]
    assert count["responses"]["count"] > 0
    with pytest.raises(ValueError, match="the spans hold 3 entries; the file 2"):
        restore_rows(torch.zeros(2), torch.tensor([[0, 3]]), 0, (1, 4))
    with pytest.raises(ValueError, match=r"outside \[0, 4\]"):
        restore_rows(torch.zeros(5), torch.tensor([[0, 5]]), 0, (1, 4))
