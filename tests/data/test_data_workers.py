"""data.dataloader_num_workers: batches collated in worker processes equal those of 0 workers,
and the loader's state and resume are unchanged."""

from __future__ import annotations

import pytest

from dataproto.equality import dataproto_equal
from stages.data.dataset import PromptRow
from stages.data.loader import StatefulPromptLoader
from stages.data.tokenize import build_prompt_dataset
from stages.data.workers import collate_batches

NUM_ROWS, BATCH = 11, 3  # 3 batches per epoch


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer):
    rows = [
        PromptRow(
            prompt=[{"role": "user", "content": f"question {i} " + "x" * i}],
            data_source="test/source",
            reward_model={"style": "rule", "ground_truth": str(i)},
            extra_info={"index": i},
            uid=f"u{i}",
        )
        for i in range(NUM_ROWS)
    ]
    return build_prompt_dataset(rows, tiny_tokenizer, max_prompt_length=32)


def _batches(loader: StatefulPromptLoader, count: int) -> list:
    try:
        return [loader.next_batch() for _ in range(count)]
    finally:
        loader.close()


def _assert_same(left: list, right: list) -> None:
    assert len(left) == len(right)
    for i, (a, b) in enumerate(zip(left, right)):
        assert dataproto_equal(a, b), f"batch {i} differs"


def test_two_workers_give_the_batches_and_state_of_zero_workers(dataset):
    """Seven batches cross two epoch boundaries; every batch and the final state are equal."""
    main = StatefulPromptLoader(dataset, BATCH, seed=3, num_workers=0)
    workers = StatefulPromptLoader(dataset, BATCH, seed=3, num_workers=2)
    _assert_same(_batches(main, 7), _batches(workers, 7))
    assert main.state_dict() == workers.state_dict()


def test_resume_with_workers_is_exact_and_drops_prefetched_batches(dataset):
    """State saved by a 0-worker loader restores a 2-worker one (the state has no worker count);
    restoring a position mid-stream discards what the workers had prefetched."""
    reference = _batches(StatefulPromptLoader(dataset, BATCH, seed=5), 6)
    saved = StatefulPromptLoader(dataset, BATCH, seed=5)
    _batches(saved, 2)
    resumed = StatefulPromptLoader(dataset, BATCH, seed=5, num_workers=2)
    try:
        first = resumed.next_batch()  # the workers now run ahead from position (0, 1)
        resumed.load_state_dict(saved.state_dict())  # back to (0, 2)
        rest = [resumed.next_batch() for _ in range(4)]
    finally:
        resumed.close()
    _assert_same([first, *rest], [reference[0], *reference[2:6]])


def test_collate_batches_keeps_the_stream_order(dataset):
    row_lists = [[4, 1], [0], [10, 9, 8], [2, 3]]
    _assert_same(
        list(collate_batches(dataset, row_lists, num_workers=2)),
        [dataset.collate(rows) for rows in row_lists],
    )


def test_negative_worker_count_is_an_error_naming_it(dataset):
    with pytest.raises(ValueError, match="num_workers must be an int >= 0"):
        StatefulPromptLoader(dataset, BATCH, num_workers=-1)
