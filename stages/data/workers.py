"""Collate prompt batches in worker processes (verl's ``data.dataloader_num_workers``).

`collate_batches` turns a stream of row-index lists into ``dataset.collate(rows)`` batches, in the
stream's order. With ``num_workers`` = 0 it collates in this process; otherwise a
``torch.utils.data.DataLoader`` does, with that many worker processes, each batch built whole in
one worker (``batch_size=None``: the key the loader hands a worker *is* the row list), prefetching
``prefetch_factor`` batches per worker. The batches are the same objects either way: the row lists
are drawn in this process, and a worker only runs ``collate`` on the rows it is given, so what
comes out is independent of the number of workers.

Workers start with the ``forkserver`` method (``fork`` after torch and threads is unsafe), receive
the dataset once, and stop when the returned iterator is closed or collected.

Example:
    >>> class Rows:
    ...     def __len__(self): return 4
    ...     def collate(self, indices): return [10 * i for i in indices]
    >>> list(collate_batches(Rows(), [[0, 1], [3]], num_workers=0))
    [[0, 10], [30]]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset

from stages.data.tokenize import START_METHOD


class _CollateRows(Dataset):
    """A map-style view whose item at key ``rows`` (a tuple of row indices) is one batch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, rows: tuple[int, ...]) -> Any:
        return self.dataset.collate(list(rows))

    def __len__(self) -> int:
        return len(self.dataset)


class _RowLists:
    """The stream of row lists as a DataLoader sampler (iterated once, in this process)."""

    def __init__(self, row_lists: Iterable[Sequence[int]]) -> None:
        self.row_lists = row_lists

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return (tuple(int(i) for i in rows) for rows in self.row_lists)


def _as_is(batch: Any) -> Any:
    """The DataLoader's collate_fn: the dataset already returns whole batches."""
    return batch


def collate_batches(
    dataset: Any,
    row_lists: Iterable[Sequence[int]],
    num_workers: int,
    *,
    prefetch_factor: int = 2,
) -> Iterator[Any]:
    """``dataset.collate(rows)`` for each ``rows`` of ``row_lists``, in order (module docstring).

    Args:
        dataset: anything with ``__len__`` and ``collate(indices)`` (e.g. `PromptDataset`);
            picklable when ``num_workers`` > 0.
        row_lists: the batches' row indices; may be infinite (it is consumed lazily, at most
            ``num_workers × prefetch_factor`` lists ahead of the batches taken).
        num_workers: worker processes; 0 = collate in this process.
    """
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0 (processes), got {num_workers!r}")
    if num_workers == 0:
        return (dataset.collate(list(rows)) for rows in row_lists)
    loader = DataLoader(
        _CollateRows(dataset),
        batch_size=None,
        sampler=_RowLists(row_lists),
        num_workers=num_workers,
        collate_fn=_as_is,
        multiprocessing_context=START_METHOD,
        prefetch_factor=prefetch_factor,
    )
    return iter(loader)
