"""A sample of a training step's generations as a table: ``train_generations/step_<K>.json``.

What TRL's ``log_completions`` shows, for the samples the update trained on. With
``ppoflow.log_train_generations`` = G > 0, the training flow logs a table (MLflow's table
artifact, next to the validation tables) at step 1, at every step that validates
(``trainer.test_freq``) and at the last step: the samples of the step's first G prompt groups
(``uid``, in the order the final batch holds them), every sample of a group, so the spread that a
group-relative advantage reads is in the table. One row per sample:

- ``step``, ``uid``; ``input`` (the prompt) and ``output`` (the response: the tokens of
  ``response_mask``), decoded, special tokens skipped; ``ground_truth``;
- ``score``: Σ_t ``token_level_scores`` (the reward before any KL penalty, as the rollout dump's);
- ``advantage``: the mean of ``advantages`` over the row's ``response_mask`` (the value each
  token holds for an outcome estimator, GRPO, RLOO, …; their mean for GAE); None for an empty
  response;
- ``response_length``: Σ ``response_mask``;
- every per-sample reward extra (``acc``, ``pred``, …) named by ``meta_info["reward_extra_keys"]``.

The step's final batch holds all of these in one row order (the balance stage reordered the whole
batch), so no join is needed here; ``ppoflow inspect RUN --step K --samples N`` reads the same
values from the artifacts.

Beside each table, the same groups' samples as a page (``train_samples/step_<K>.html``,
:func:`step_page`: flows/runs/sample_page.py, each response token coloured by its advantage,
ratio or log-prob), joined from the step's artifacts in generation order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dataproto import DataProto
from dataproto import keys as K
from flows.runs.samples import masked_row_means
from flows.sinks.generations_dump import decode_masked, reward_extras

#: the table's artifact file; zero-padded, so the files sort by step
TABLE = "train_generations/step_{step:06d}.json"
#: the sample page's artifact file
PAGE = "train_samples/step_{step:06d}.html"


def table_due(step: int, test_freq: int, last: int) -> bool:
    """Whether step ``step`` logs a table: step 1, every ``test_freq``-th step, the last.

    >>> [step for step in range(1, 11) if table_due(step, 4, 10)]
    [1, 4, 8, 10]
    >>> [step for step in range(1, 6) if table_due(step, -1, 5)]
    [1, 5]
    """
    return step in (1, last) or (test_freq > 0 and step % test_freq == 0)


def first_groups(uid: np.ndarray, groups: int) -> np.ndarray:
    """Row indices of the first ``groups`` prompt groups (order of first appearance), grouped,
    each group's rows in batch order.

    >>> first_groups(np.array(["b", "a", "b", "c", "a"], dtype=object), 2).tolist()
    [0, 2, 1, 4]
    """
    chosen: dict[Any, list[int]] = {}
    for row, group in enumerate(uid.tolist()):
        if group in chosen:
            chosen[group].append(row)
        elif len(chosen) < groups:
            chosen[group] = [row]
    return np.array([row for rows in chosen.values() for row in rows], dtype=np.int64)


def train_generation_rows(
    batch: DataProto, tokenizer: Any, step: int, groups: int
) -> list[dict[str, Any]]:
    """The table's rows for a training step's final ``batch`` (module docstring)."""
    if groups <= 0 or len(batch) == 0:
        return []
    rows = first_groups(np.asarray(batch.non_tensor_batch[K.UID], dtype=object), groups)
    sample = batch.select_idxs(rows)
    tensors = sample.batch
    mask = tensors[K.RESPONSE_MASK]
    width = tensors[K.PROMPTS].shape[1]
    truths = sample.non_tensor_batch.get(K.REWARD_MODEL, [None] * len(sample))
    columns: dict[str, list[Any]] = {
        "step": [step] * len(sample),
        "uid": [str(u) for u in sample.non_tensor_batch[K.UID]],
        "input": decode_masked(tokenizer, tensors[K.PROMPTS], tensors[K.ATTENTION_MASK][:, :width]),
        "output": decode_masked(tokenizer, tensors[K.RESPONSES], mask),
        "score": tensors[K.TOKEN_LEVEL_SCORES].sum(-1).tolist(),
        "advantage": masked_row_means(tensors[K.ADVANTAGES].float(), mask),
        "response_length": mask.sum(-1).tolist(),
        "ground_truth": [t.get("ground_truth") if isinstance(t, dict) else None for t in truths],
    }
    for name, values in reward_extras(sample).items():
        if len(values) == len(sample):
            columns[name] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return [{name: values[i] for name, values in columns.items()} for i in range(len(sample))]


__all__ = ["TABLE", "first_groups", "table_due", "train_generation_rows"]


def step_page(store: Any, step: int, tokenizer: Any, uids: Iterable[Any]) -> str:
    """The sample page of step ``step``'s samples of the prompt groups ``uids`` (the table's), in
    generation order, from the run's artifacts (``flows.runs.samples.load_step_samples``, sizes
    checked)."""
    from dataclasses import replace

    from flows.runs.sample_page import render_page
    from flows.runs.samples import Decoder, load_step_samples

    found = load_step_samples(store, step, verify="lazy")
    wanted = {str(uid) for uid in uids}
    chosen = [sample for sample in found.samples if sample.columns.get("uid") in wanted]
    return render_page(replace(found, samples=chosen), Decoder(tokenizer, None))
