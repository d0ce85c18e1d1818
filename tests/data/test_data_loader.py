"""StatefulPromptLoader: seeded epochs, JSON state, exact resume (mid-epoch and at the boundary)."""

from __future__ import annotations

import json

import pytest

from stages.data.dataset import PromptRow
from stages.data.loader import StatefulPromptLoader
from stages.data.tokenize import INDEX, build_prompt_dataset

NUM_ROWS, BATCH = 11, 3  # 3 batches per epoch, 2 rows dropped each epoch


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer):
    rows = [
        PromptRow(
            prompt=[{"role": "user", "content": f"q{i}"}],
            data_source="test/source",
            reward_model={"style": "rule", "ground_truth": str(i)},
            extra_info={"index": i},
        )
        for i in range(NUM_ROWS)
    ]
    return build_prompt_dataset(rows, tiny_tokenizer, max_prompt_length=16)


def _ids(batch) -> list[int]:
    """The dataset rows of a prompt batch (their extra_info index)."""
    return batch.non_tensor_batch[INDEX].tolist()


def _loader(dataset, **kwargs) -> StatefulPromptLoader:
    kwargs = {"shuffle": True, "seed": 7, **kwargs}
    return StatefulPromptLoader(dataset, BATCH, **kwargs)


def _run(loader, num_batches: int) -> list[list[int]]:
    return [_ids(loader.next_batch()) for _ in range(num_batches)]


def test_len_and_epochs_cover_distinct_rows(dataset):
    loader = _loader(dataset)
    assert len(loader) == NUM_ROWS // BATCH == 3
    epoch0 = [row for batch in loader for row in _ids(batch)]
    assert loader.epoch == 1 and loader.batch_index == 0
    epoch1 = [row for batch in loader for row in _ids(batch)]
    assert len(set(epoch0)) == len(epoch0) == 9
    assert epoch0 != epoch1  # a fresh permutation per epoch
    assert len(_loader(dataset, drop_last=False)) == 4


def test_same_seed_same_batches_different_seed_different(dataset):
    assert _run(_loader(dataset), 9) == _run(_loader(dataset), 9)
    assert _run(_loader(dataset), 9) != _run(_loader(dataset, seed=8), 9)


def test_no_shuffle_is_dataset_order_and_last_batch_kept(dataset):
    loader = _loader(dataset, shuffle=False, drop_last=False)
    assert [_ids(b) for b in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


def test_state_is_json_serialisable(dataset):
    loader = _loader(dataset)
    _run(loader, 4)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert (state["epoch"], state["batch_index"]) == (1, 1)


@pytest.mark.parametrize("cut", range(0, 10))
def test_resume_gives_exactly_the_uninterrupted_batches(dataset, cut):
    """Cut after `cut` batches (3, 6 and 9 are epoch boundaries), resume in a fresh loader."""
    total = 10
    uninterrupted = _run(_loader(dataset), total)
    first = _loader(dataset)
    head = _run(first, cut)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    assert head + _run(resumed, total - cut) == uninterrupted


def test_resume_at_epoch_boundary_with_epoch_loop(dataset):
    """The trainer's loop shape: for epoch …: for batch in loader. Save after the last batch of
    epoch 0 (verl's exhausted-state case); the resumed run continues with epoch 1's first batch."""
    reference = _loader(dataset)
    expected = [_ids(b) for _ in range(3) for b in reference]

    first = _loader(dataset)
    seen = [_ids(b) for b in first]  # the whole of epoch 0
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batch_index"]) == (1, 0)

    resumed = _loader(dataset)
    resumed.load_state_dict(state)
    for _epoch in range(resumed.epoch, 3):
        seen += [_ids(b) for b in resumed]
    assert seen == expected


def test_exhausted_state_resumes_at_next_epoch(dataset):
    """A state saved as (epoch e, batch_index == len) means the same as (e + 1, 0)."""
    loader = _loader(dataset)
    state = {**loader.state_dict(), "epoch": 0, "batch_index": 3}
    loader.load_state_dict(state)
    assert (loader.epoch, loader.batch_index) == (1, 0)
    assert _ids(loader.next_batch()) == _run(_loader(dataset), 4)[3]


def test_mid_epoch_iteration_yields_only_the_rest(dataset):
    loader = _loader(dataset)
    _run(loader, 1)
    assert len(list(loader)) == 2 and loader.epoch == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [("seed", 8), ("batch_size", 2), ("num_rows", 12), ("shuffle", False), ("drop_last", False)],
)
def test_state_from_different_settings_is_rejected(dataset, key, value):
    loader = _loader(dataset)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(ValueError, match=f"saved with {key}="):
        loader.load_state_dict(state)


def test_malformed_state_and_bad_arguments(dataset):
    loader = _loader(dataset)
    with pytest.raises(ValueError, match="lacks"):
        loader.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="out of range"):
        loader.load_state_dict({**loader.state_dict(), "batch_index": 4})
    with pytest.raises(ValueError, match="too few for one batch of 12"):
        StatefulPromptLoader(dataset, 12)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        StatefulPromptLoader(dataset, 0)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        StatefulPromptLoader(dataset, 2, seed=-1)
