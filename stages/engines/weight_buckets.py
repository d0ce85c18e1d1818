"""The actor's weights on their way to a rollout engine: checked one tensor at a time, never
gathered into one host copy of the whole model.

Two shapes, one per transport (`rollout_vllm.VLLMRollout.sync_weights`):

- :func:`named_tensors`: a lazy ``(name, tensor)`` stream for an engine in the same process; each
  tensor is passed as it is (its device, its storage: no copy), so peak extra memory is what the
  producer holds (one parameter under ZeRO-3's per-parameter gather, `roles.ActorWorker`).
- :func:`safetensors_buckets`: safetensors ``bytes`` of at most ``bucket_bytes`` of tensor data each
  (a tensor larger than that gets a bucket of its own), for an engine in other processes; the
  host holds one bucket's CPU copies and bytes at a time, not the model.

Tensors sharing storage (tied embeddings) are cloned inside a bucket, which safetensors needs.

Example:
    >>> import torch
    >>> weights = [("a", torch.zeros(4)), ("b", torch.zeros(4)), ("c", torch.zeros(2))]
    >>> [len(names) for names in bucket_names(weights, bucket_bytes=32)]
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from torch import Tensor

NamedTensors = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]

#: bytes of tensor data per safetensors bucket: a bucket smaller than the model bounds a sync's
#: peak host memory (bench/weight_sync.py; figures in bench/README.md)
DEFAULT_BUCKET_BYTES = 64 << 20


def named_tensors(weights: NamedTensors) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor.detach())`` of ``weights`` (a ``state_dict()`` or any ``(name, tensor)``
    iterable), lazily; raises TypeError naming the first entry that is not a tensor."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    for name, tensor in items:
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"weight {name!r} is a {type(tensor).__name__}, expected a torch.Tensor"
            )
        yield name, tensor.detach()


def _buckets(weights: NamedTensors, bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Consecutive groups of ``weights`` with ≤ ``bucket_bytes`` of data each (a larger tensor
    alone), each tensor a contiguous CPU tensor."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be at least 1, got {bucket_bytes}")
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in named_tensors(weights):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor.to("cpu").contiguous()))
        size += nbytes
    if bucket:
        yield bucket


def bucket_names(weights: NamedTensors, bucket_bytes: int) -> list[list[str]]:
    """The names in each bucket :func:`safetensors_buckets` would send (for tests and logs)."""
    return [[name for name, _ in bucket] for bucket in _buckets(weights, bucket_bytes)]


def safetensors_buckets(
    weights: NamedTensors, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[bytes]:
    """Each bucket of ``weights`` as safetensors bytes (tensors sharing storage cloned first)."""
    from safetensors.torch import save

    for bucket in _buckets(weights, bucket_bytes):
        seen: set[int] = set()
        unshared = {}
        for name, tensor in bucket:
            pointer = tensor.untyped_storage().data_ptr()
            unshared[name] = tensor.clone() if pointer in seen else tensor
            seen.add(pointer)
        yield save(unshared)


def tensors_of(payload: bytes | bytearray | memoryview) -> list[tuple[str, Tensor]]:
    """``[(name, tensor)]`` of one safetensors bucket."""
    from safetensors.torch import load

    return list(load(bytes(payload)).items())
