"""Plain-text description of an artifact: what ``ppoflow inspect`` prints.

Sections: the manifest (path, format, fingerprint, rows, bytes, stage), the schema table, per-key
statistics of the three layers (min / max / mean of numeric tensors and arrays, distinct count and
examples of object columns, meta_info values), and the token ledger when the batch holds
``responses`` with ``attention_mask`` or ``response_mask``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dataproto.artifact import Verify, load_artifact, read_manifest
from dataproto.keys import ATTENTION_MASK, RESPONSE_MASK, RESPONSES
from dataproto.ledger import ledger_from_batch
from dataproto.schema import format_schema, schema_from_json
from dataproto.trimmed_rows import SPANS_SUFFIX

EXAMPLES = 3
SHORT = 60


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"


def tensor_stats(tensor: torch.Tensor) -> str:
    """min / max / mean of a tensor (bools: count of True), NaNs counted apart.

    >>> tensor_stats(torch.tensor([[1.0, float("nan")], [3.0, 5.0]]))
    'min 1 max 5 mean 3 (1 NaN)'
    >>> tensor_stats(torch.tensor([True, False, True]))
    'true 2 of 3'
    """
    if tensor.numel() == 0:
        return "empty"
    if tensor.dtype == torch.bool:
        return f"true {int(tensor.sum())} of {tensor.numel()}"
    if tensor.is_complex():
        return f"mean |x| {tensor.abs().double().mean().item():.4g}"
    values = tensor.double().reshape(-1)
    nan = torch.isnan(values)
    finite = values[~nan]
    if finite.numel() == 0:
        return f"all NaN ({values.numel()})"
    if tensor.is_floating_point():
        low, high = f"{finite.min().item():.4g}", f"{finite.max().item():.4g}"
    else:  # exact integers (token ids, masks)
        low, high = str(int(tensor.min())), str(int(tensor.max()))
    text = f"min {low} max {high} mean {finite.mean().item():.4g}"
    return text + (f" ({int(nan.sum())} NaN)" if bool(nan.any()) else "")


def array_stats(array: np.ndarray) -> str:
    """Numeric arrays: as :func:`tensor_stats`; object/string arrays: distinct count and examples.

    >>> array_stats(np.array(["a", "b", "a"], dtype=object))
    "2 distinct; e.g. 'a', 'b'"
    """
    if array.dtype.kind in "biuf":
        return tensor_stats(torch.from_numpy(np.ascontiguousarray(array)))
    keys: dict[str, Any] = {}
    for value in array.ravel():
        key = _distinct_key(value)
        keys.setdefault(key, value)
    examples = ", ".join(_short(v) for v in list(keys.values())[:EXAMPLES])
    return f"{len(keys)} distinct" + (f"; e.g. {examples}" if examples else "")


def _distinct_key(value: Any) -> str:
    try:
        return f"{type(value).__name__}:{json.dumps(value, sort_keys=True, default=repr)}"
    except (TypeError, ValueError):  # e.g. a dict with mixed key types
        return f"{type(value).__name__}:{value!r}"


def _manifest_lines(path: str, manifest: dict[str, Any]) -> list[str]:
    lines = [
        f"artifact     {path}",
        f"format       {manifest['format']} v{manifest['format_version']}",
        f"fingerprint  {manifest['fingerprint']} (sha256; files: {manifest['digest']})",
        f"rows         {manifest['rows']}",
        f"bytes        {manifest['nbytes']} in {len(manifest['files'])} files",
    ]
    batch = manifest.get("batch") or {}
    stored = {k: v for k, v in (batch.get("stored") or {}).items() if not k.endswith(SPANS_SUFFIX)}
    if stored:  # integer tensors kept narrow on disk (dataproto/compact_dtypes.py)
        shown = ", ".join(f"{name} {dtype}" for name, dtype in stored.items())
        lines.append(f"on disk as   {shown} (loaded in the schema's dtypes)")
    trimmed = batch.get("trimmed") or {}
    if trimmed:  # padding left off on disk (dataproto/trimmed_rows.py)
        shapes = {r["name"]: r["shape"] for r in manifest["schema"] if r["layer"] == "batch"}
        shown = ", ".join(
            f"{name} {info['count']}/{shapes[name][0] * shapes[name][1]}"
            for name, info in trimmed.items()
        )
        lines.append(f"padding off  {shown} cells kept (padded again on load)")
    if manifest.get("stage") is not None:
        version = manifest.get("stage_version")
        lines.append(
            f"stage        {manifest['stage']}" + (f" (version {version})" if version else "")
        )
    for field in ("config", "extra"):
        if manifest.get(field) is not None:
            lines.append(f"{field:<12} {_short(manifest[field])}")
    return lines


def _layer_lines(data: Any) -> list[str]:
    lines = ["", "batch (tensors)"]
    if data.batch is None:
        lines.append("  (none)")
    else:
        for key, tensor in data.batch.items():
            lines.append(f"  {key}: {tensor_stats(tensor)}")
    lines += ["", "non_tensor_batch"]
    lines += [f"  {k}: {array_stats(v)}" for k, v in data.non_tensor_batch.items()] or ["  (none)"]
    lines += ["", "meta_info"]
    lines += [f"  {k}: {_short(v)}" for k, v in data.meta_info.items()] or ["  (none)"]
    return lines


def _has_ledger_keys(data: Any) -> bool:
    if data.batch is None:
        return False
    names = set(data.batch.keys())
    return RESPONSES in names and bool(names & {ATTENTION_MASK, RESPONSE_MASK})


#: ``complete(data, manifest) -> (data, note)``: the loaded artifact with keys its stage left out
#: rebuilt (``note`` says which and from what; None when nothing was left out)
Completion = Callable[[Any, dict[str, Any]], tuple[Any, str | None]]


def describe_artifact(
    path: str | os.PathLike, *, verify: Verify = "full", complete: Completion | None = None
) -> str:
    """The text ``ppoflow inspect`` prints for the artifact at ``path`` (module docstring);
    ``complete`` rebuilds what the artifact's stage left out (derived keys), shown with the rest.

    Raises:
        ArtifactError: when the artifact fails verification (``verify`` as in load_artifact).
    """
    manifest = read_manifest(path)
    data = load_artifact(path, verify=verify)
    note = None
    if complete is not None:
        data, note = complete(data, manifest)
    lines = _manifest_lines(os.fspath(path), manifest)
    if note is not None:
        lines.append(f"derived      {note}")
    lines += ["", "schema", format_schema(schema_from_json(manifest["schema"]))]
    lines += _layer_lines(data)
    if _has_ledger_keys(data):
        lines += ["", ledger_from_batch(data).format()]
    return "\n".join(lines)
