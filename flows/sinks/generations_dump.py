"""Generations as JSON Lines, one file per step: verl's ``trainer.rollout_data_dir`` and
``trainer.validation_data_dir``.

``<dir>/<step>.jsonl`` holds one JSON object per sample, with verl's ``_dump_generations`` fields:

- ``input``: the prompt text, ``output``: the response text (valid tokens only, special tokens
  skipped);
- ``gts``: ``reward_model["ground_truth"]`` (null when the row has none);
- ``score``: the sample's scalar score;
- ``step``: the global step;
- every reward extra (``acc``, ``pred``, …: the keys named by ``meta_info["reward_extra_keys"]``)
  that has one value per sample, and, for validation, ``reward`` (the score again, as verl's
  ``reward_extra_infos_dict`` holds it); an extra named ``score`` replaces the column, as in verl.

The rollout dump's score is Σ_t ``token_level_scores`` (verl's), so an aborted (empty) response
scores 0 there; the validation dump's is the reward stage's ``seq_scores``. Values that JSON
cannot hold directly are converted: numpy and torch scalars / arrays to numbers / lists, anything
else to its ``str``. The directory may be a local path or an fsspec URL; a file already there for
the step is replaced (a resumed run rewrites the steps it repeats).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import fsspec
import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K


def _plain(value: Any) -> Any:
    """A JSON-ready copy of one value (the module docstring's conversions)."""
    if isinstance(value, np.generic | torch.Tensor) and np.ndim(value) == 0:
        return value.item()
    if isinstance(value, np.ndarray | torch.Tensor):
        return value.tolist()
    return str(value)


def generation_records(
    columns: dict[str, Sequence[Any]], extras: dict[str, Sequence[Any]], step: int
) -> list[dict[str, Any]]:
    """One record per sample, verl's field order: ``columns`` (input, output, gts, score, each of
    length n), ``step``, then every extra of length n (others are left out; an extra named like a
    column replaces it, as in verl).

    Example:
        >>> generation_records({"input": ["a"], "output": ["b"], "gts": ["1"], "score": [1.0]},
        ...                    {"acc": [True], "per_batch": [1, 2]}, step=3)
        [{'input': 'a', 'output': 'b', 'gts': '1', 'score': 1.0, 'step': 3, 'acc': True}]
    """
    n = len(columns["input"])
    fields = {**columns, "step": [step] * n, **{k: v for k, v in extras.items() if len(v) == n}}
    return [{k: v[i] for k, v in fields.items()} for i in range(n)]


def write_jsonl(directory: str, step: int, records: Iterable[dict[str, Any]]) -> str:
    """Write ``records`` to ``<directory>/<step>.jsonl`` (created as needed); returns its path."""
    fs, root = fsspec.core.url_to_fs(directory)
    fs.makedirs(root, exist_ok=True)
    path = f"{directory.rstrip('/')}/{step}.jsonl"
    lines = [json.dumps(r, ensure_ascii=False, default=_plain) + "\n" for r in records]
    with fsspec.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(lines)
    return path


def decode_masked(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """(B, W) ids and their (B, W) mask → the B texts of the masked tokens, specials skipped."""
    rows = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def _texts_and_truths(batch: DataProto, tokenizer: Any) -> dict[str, list[Any]]:
    tensors = batch.batch
    width = tensors[K.PROMPTS].shape[1]
    rewards = batch.non_tensor_batch.get(K.REWARD_MODEL, [None] * len(batch))
    return {
        "input": decode_masked(tokenizer, tensors[K.PROMPTS], tensors[K.ATTENTION_MASK][:, :width]),
        "output": decode_masked(tokenizer, tensors[K.RESPONSES], tensors[K.RESPONSE_MASK]),
        "gts": [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in rewards],
    }


def reward_extras(source: DataProto) -> dict[str, list[Any]]:
    """The reward extras ``source`` names in ``meta_info["reward_extra_keys"]``, as lists."""
    names = source.meta_info.get(K.REWARD_EXTRA_KEYS, [])
    return {name: list(source.non_tensor_batch[name]) for name in names}


def rollout_records(batch: DataProto, tokenizer: Any, step: int) -> list[dict[str, Any]]:
    """The records of a training step's final batch (prompts, responses, masks,
    ``token_level_scores``, ``reward_model``, the reward extras)."""
    columns = _texts_and_truths(batch, tokenizer)
    columns["score"] = batch.batch[K.TOKEN_LEVEL_SCORES].sum(-1).tolist()
    return generation_records(columns, reward_extras(batch), step)


def validation_records(
    scored: Sequence[tuple[DataProto, DataProto]], tokenizer: Any, step: int
) -> list[dict[str, Any]]:
    """The records of a validation pass: its (generated batch, reward delta) pairs, in order."""
    records: list[dict[str, Any]] = []
    for batch, reward in scored:
        columns = _texts_and_truths(batch, tokenizer)
        columns["score"] = reward.batch[K.SEQ_SCORES].tolist()
        extras = {"reward": columns["score"], **reward_extras(reward)}
        records.extend(generation_records(columns, extras, step))
    return records


def dump_rollout(directory: str | None, batch: DataProto, tokenizer: Any, step: int) -> None:
    """``trainer.rollout_data_dir``: the step's generations → ``<directory>/<step>.jsonl``
    (nothing when ``directory`` is None)."""
    if directory is not None:
        write_jsonl(directory, step, rollout_records(batch, tokenizer, step))


def dump_validation(
    directory: str | None,
    scored: Sequence[tuple[DataProto, DataProto]],
    tokenizer: Any,
    step: int,
) -> None:
    """``trainer.validation_data_dir``: a validation's generations → ``<directory>/<step>.jsonl``
    (nothing when ``directory`` is None)."""
    if directory is not None:
        write_jsonl(directory, step, validation_records(scored, tokenizer, step))
