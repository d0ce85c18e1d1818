"""A seeded prompt loader whose position can be saved and restored exactly.

The order of epoch ``e`` is a pure function of (``seed``, ``e``): with ``shuffle`` it is the
permutation drawn by ``numpy.random.default_rng([seed, e])``, otherwise the dataset order. So the
state is three integers (epoch, batch position, seed) plus the sizes that must not change, all
JSON-serialisable, and no RNG state is pickled.

The position advances when a batch is handed out. After the last batch of an epoch the state
already points at the next epoch's first batch, so a checkpoint taken exactly at an epoch boundary
resumes with that batch. (verl 0.9.1 saves the sampler there as exhausted and therefore skips
restoring the loader whenever global_steps is a multiple of the epoch length; here a resumed run
sees exactly the batches an uninterrupted run would, boundary included.)

With ``num_workers`` > 0 (verl's ``data.dataloader_num_workers``) the batches are collated in
worker processes (`stages.data.workers.collate_batches`), prefetched from the current position
on; the row order is still drawn here, so the batches, the position and the state are those of
``num_workers=0``. Prefetched batches past a restored position are dropped.

Example:
    >>> class Rows:
    ...     def __len__(self): return 5
    ...     def collate(self, indices): return list(indices)
    >>> loader = StatefulPromptLoader(Rows(), batch_size=2, shuffle=False, seed=0)
    >>> len(loader), [b for b in loader], loader.state_dict()["epoch"]
    (2, [[0, 1], [2, 3]], 1)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from stages.data.workers import collate_batches

STATE_VERSION = 1


class Collatable(Protocol):
    """What the loader needs from a dataset: its length and a batch of given rows."""

    def __len__(self) -> int: ...

    def collate(self, indices: Sequence[int]) -> Any: ...


def epoch_row_order(num_rows: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """(N,) int64 row order of ``epoch``: the permutation drawn by ``default_rng([seed, epoch])``
    with ``shuffle``, else 0…N−1.

    Example:
        >>> epoch_row_order(4, shuffle=False, seed=0, epoch=3).tolist()
        [0, 1, 2, 3]
    """
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(num_rows)
    return np.arange(num_rows, dtype=np.int64)


def _row_lists(
    num_rows: int,
    batch_size: int,
    num_batches: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    batch_index: int,
) -> Iterator[list[int]]:
    """Row lists of every batch from (epoch, batch_index) on, epoch after epoch (the same rows
    as `StatefulPromptLoader.batch_rows`; no reference to the loader)."""
    for e in itertools.count(epoch):
        order = epoch_row_order(num_rows, shuffle=shuffle, seed=seed, epoch=e)
        for b in range(batch_index if e == epoch else 0, num_batches):
            yield order[b * batch_size : (b + 1) * batch_size].tolist()


class StatefulPromptLoader:
    """Yields prompt batches (``dataset.collate(indices)``) epoch after epoch, resumably.

    Args:
        dataset: a `Collatable` (e.g. `PromptDataset`).
        batch_size: prompts per batch (verl's ``data.train_batch_size``).
        shuffle: a fresh permutation each epoch, seeded from (seed, epoch).
        seed: non-negative int.
        drop_last: drop the last incomplete batch (verl's train loader does).
        num_workers: processes that collate the batches; 0 = this process. Close the loader
            (`close`) to stop them early; they also stop when it is collected.

    ``len(loader)`` is the number of batches per epoch. Iterating yields the remaining batches of
    the current epoch; `next_batch` crosses epoch boundaries.
    """

    def __init__(
        self,
        dataset: Collatable,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_workers: int = 0,
    ) -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (processes), got {num_workers!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        num_rows = len(dataset)
        if num_rows == 0 or (drop_last and num_rows < batch_size):
            raise ValueError(
                f"the dataset has {num_rows} rows, too few for one batch of {batch_size} "
                f"(drop_last={drop_last}); lower the batch size or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_rows = num_rows
        self.num_workers = num_workers
        self._epoch = 0
        self._batch_index = 0
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its row order), reused
        # the worker stream and the (epoch, batch_index) of the next batch it yields
        self._stream: Iterator[Any] | None = None
        self._stream_at: tuple[int, int] | None = None

    def __len__(self) -> int:
        full, rest = divmod(self.num_rows, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def batch_index(self) -> int:
        """The position of the next batch within its epoch (0 ≤ batch_index < len(self))."""
        return self._batch_index

    @property
    def batches_served(self) -> int:
        """Batches handed out since epoch 0 started: epoch · len(self) + batch_index."""
        return self._epoch * len(self) + self._batch_index

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(N,) int64 row order of ``epoch`` (`epoch_row_order`), cached for the epoch."""
        if self._order is None or self._order[0] != epoch:
            order = epoch_row_order(
                self.num_rows, shuffle=self.shuffle, seed=self.seed, epoch=epoch
            )
            self._order = (epoch, order)
        return self._order[1]

    def batch_rows(self, epoch: int, batch_index: int) -> list[int]:
        """Row indices of batch ``batch_index`` of ``epoch``."""
        start = batch_index * self.batch_size
        return self.epoch_order(epoch)[start : start + self.batch_size].tolist()

    def next_batch(self) -> Any:
        """The next batch; moves the position on (to the next epoch after its last batch)."""
        position = (self._epoch, self._batch_index)
        if self.num_workers == 0:
            batch = self.dataset.collate(self.batch_rows(*position))
        else:
            batch = self._from_workers(position)
        self._batch_index += 1
        if self._batch_index == len(self):
            self._epoch, self._batch_index = self._epoch + 1, 0
        if self._stream is not None:
            self._stream_at = (self._epoch, self._batch_index)
        return batch

    def _from_workers(self, position: tuple[int, int]) -> Any:
        if self._stream is None or self._stream_at != position:
            self.close()  # a restored position: what was prefetched is not what comes next
            row_lists = _row_lists(
                self.num_rows, self.batch_size, len(self), self.shuffle, self.seed, *position
            )
            self._stream = collate_batches(self.dataset, row_lists, self.num_workers)
        return next(self._stream)

    def close(self) -> None:
        """Stop the worker processes (the stream holds no reference back to the loader, so
        dropping it stops them at once); a later batch starts them again."""
        self._stream, self._stream_at = None, None

    def __iter__(self) -> Iterator[Any]:
        for _ in range(len(self) - self._batch_index):
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: epoch, batch_index, seed and the sizes it depends on."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batch_index": self._batch_index,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "num_rows": self.num_rows,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by `state_dict`.

        Raises:
            ValueError: the state was saved with a different seed, shuffle, batch size,
                drop_last or dataset size (the batches would differ), or is malformed.
        """
        missing = {"epoch", "batch_index", *self._fixed_fields()} - set(state)
        if missing:
            raise ValueError(f"loader state lacks {sorted(missing)}; got keys {sorted(state)}")
        for name, current in self._fixed_fields().items():
            if state[name] != current:
                raise ValueError(
                    f"loader state was saved with {name}={state[name]!r} but this loader has "
                    f"{name}={current!r}; resume with the same data and data settings"
                )
        epoch, batch_index = int(state["epoch"]), int(state["batch_index"])
        if epoch < 0 or not 0 <= batch_index <= len(self):
            raise ValueError(
                f"loader state position epoch={epoch}, batch_index={batch_index} is out of "
                f"range (epoch >= 0, 0 <= batch_index <= {len(self)})"
            )
        if batch_index == len(self):  # an exhausted epoch: continue with the next one
            epoch, batch_index = epoch + 1, 0
        self._epoch, self._batch_index = epoch, batch_index

    def _fixed_fields(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "num_rows": self.num_rows,
        }
