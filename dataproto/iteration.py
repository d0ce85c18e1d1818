"""Mini-batch iteration over a DataProto (``DataProto.make_iterator``) and verl's ``collate_fn``.

``make_iterator`` runs a torch ``DataLoader`` over row *numbers* and gathers each mini-batch with
one ``select_idxs`` call, instead of collating B single-row items. The sampler is the same one
verl uses (sequential, or ``RandomSampler`` drawing from the seeded generator when
``dataloader_kwargs={"shuffle": True}``), so a given seed visits rows in the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from dataproto.equality import list_of_dict_to_dict_of_list
from dataproto.errors import DataProtoTypeError, DataProtoValueError

if TYPE_CHECKING:
    from dataproto.item import DataProtoItem
    from dataproto.protocol import DataProto

__all__ = ["collate_fn", "make_iterator"]


def collate_fn(x: Sequence[DataProtoItem]) -> DataProto:
    """Stack single-row items into a DataProto (verl's DataLoader collate).

    Tensors are stacked; each non-tensor key becomes an object array of the rows' elements.

    >>> from dataproto import DataProto
    >>> data = DataProto.from_dict({"x": torch.tensor([1, 2, 3])}, {"uid": ["a", "b", "c"]})
    >>> out = collate_fn([data[2], data[0]])
    >>> out.batch["x"].tolist(), out.non_tensor_batch["uid"].tolist()
    ([3, 1], ['c', 'a'])
    """
    from dataproto.protocol import DataProto

    items = list(x)
    if not items:
        raise DataProtoValueError("collate_fn: got no items to collate")
    batch = None
    if items[0].batch is not None:
        batch = torch.stack([item.batch for item in items]).contiguous()
    columns = list_of_dict_to_dict_of_list([item.non_tensor_batch for item in items])
    non_tensor = {key: np.array(values, dtype=object) for key, values in columns.items()}
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


class _RowRange(torch.utils.data.Dataset):
    """The dataset 0 … n − 1: the DataLoader samples row numbers, not rows."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class _GatherRows:
    """Collate: a list of row numbers → ``data.select_idxs(rows)`` (picklable for workers)."""

    def __init__(self, data: DataProto) -> None:
        self.data = data

    def __call__(self, rows: list[int]) -> DataProto:
        return self.data.select_idxs(np.asarray(rows, dtype=np.int64))


def make_iterator(
    data: DataProto,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict[str, Any] | None = None,
) -> Iterator[DataProto]:
    """Yield ``epochs × len(data) / mini_batch_size`` mini-batches (see DataProto.make_iterator)."""
    length = len(data)
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int | np.integer):
        raise DataProtoTypeError(
            f"make_iterator: mini_batch_size must be an int, got {mini_batch_size!r}"
        )
    if mini_batch_size <= 0 or length % mini_batch_size != 0:
        raise DataProtoValueError(
            f"make_iterator: {length} rows do not split into mini-batches of {mini_batch_size} "
            f"({length} % {mini_batch_size} != 0); choose a divisor of {length} or pad with "
            "pad_dataproto_to_divisor first"
        )
    if epochs < 0:
        raise DataProtoValueError(f"make_iterator: epochs must be >= 0, got {epochs}")
    kwargs = dict(dataloader_kwargs or {})
    if not isinstance(dataloader_kwargs or {}, dict):
        raise DataProtoTypeError(
            f"make_iterator: dataloader_kwargs must be a dict, got {type(dataloader_kwargs).__name__}"
        )
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader = DataLoader(
        dataset=_RowRange(length),
        batch_size=mini_batch_size,
        collate_fn=_GatherRows(data),
        generator=generator,
        **kwargs,
    )

    def batches() -> Iterator[DataProto]:
        for _ in range(epochs):
            for mini_batch in loader:
                mini_batch.meta_info = data.meta_info
                yield mini_batch

    return batches()
