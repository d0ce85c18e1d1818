"""Does a rollout engine hold the weights it was just sent? A probe of every weight sync.

A sync that silently does nothing (a reload that skipped its tensors, an engine that kept a
stale copy) makes every later rollout come from old weights, with no error anywhere. The
probe keeps a copy of the *probed* tensors as they stream to the engine — the normalisation
weights (``…norm.weight``): small, trained, replicated over tensor-parallel ranks and kept
unpacked by the engine — and after the reload compares, per engine worker, the digest of the
engine's tensor of that name with the digest of the sent tensor cast to the engine's dtype.
They must be equal bit for bit: a cast is deterministic, so a correct sync always passes and a
sync that left a probed tensor as it was fails as soon as the update moved it by more than
the engine dtype's rounding.

:class:`SyncCheck` (probed, mismatched) is what a sync reports; the rollout logs it as
``rollout/weight_sync/{probed,mismatched}`` and the ``weight_sync`` health check reads it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

PROBED_SUFFIX = "norm.weight"
PROBED = "rollout/weight_sync/probed"
MISMATCHED = "rollout/weight_sync/mismatched"


def is_probed(name: str) -> bool:
    """Whether the sync probe checks the tensor ``name`` (module docstring)."""
    return name.endswith(PROBED_SUFFIX)


def tensor_digest(tensor: Tensor) -> str:
    """sha256 of the tensor's bytes (contiguous, on the host), with its dtype and shape, so two
    tensors share a digest only when they are equal element for element in the same dtype.

    >>> tensor_digest(torch.ones(2)) == tensor_digest(torch.ones(2, dtype=torch.float64))
    False
    """
    host = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{host.dtype}:{tuple(host.shape)}:".encode())
    digest.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def engine_digests(named: Iterable[tuple[str, Tensor]], names: Iterable[str]) -> dict:
    """``{name: (dtype name, shape, digest)}`` of the engine's tensors among ``names`` (what a
    worker answers; names it does not hold by that name are left out)."""
    wanted = set(names)
    return {
        name: (str(tensor.dtype).removeprefix("torch."), list(tensor.shape), tensor_digest(tensor))
        for name, tensor in named
        if name in wanted
    }


@dataclass(frozen=True)
class SyncCheck:
    """One sync's probe: tensors compared over all workers, and those that differed."""

    probed: int
    mismatched: tuple[str, ...] = ()

    def metrics(self) -> dict[str, float]:
        """The sync's metrics; ``mismatched`` is NaN when nothing could be probed (an engine
        holding no probed tensor by its Hugging Face name): nothing was verified."""
        mismatched = float(len(self.mismatched)) if self.probed else float("nan")
        return {PROBED: float(self.probed), MISMATCHED: mismatched}


@dataclass
class SyncProbe:
    """The sent side of one sync: :meth:`tee` keeps copies of the probed tensors of the stream,
    :meth:`compare` checks each worker's answer (:func:`engine_digests`) against them."""

    sent: dict[str, Tensor] = field(default_factory=dict)

    def tee(self, stream: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in stream:
            if is_probed(name):
                self.sent[name] = tensor.detach().to("cpu", copy=True)
            yield name, tensor

    def compare(self, answers: Iterable[Mapping[str, tuple]]) -> SyncCheck:
        """:class:`SyncCheck` over the workers' answers: a probed name is mismatched when its
        engine digest differs from the sent tensor's cast to the engine's dtype. A tensor the
        engine holds in another shape (a shard) is not compared."""
        probed, mismatched = 0, []
        for answer in answers:
            for name, (dtype, shape, digest) in sorted(answer.items()):
                if tuple(shape) != tuple(self.sent[name].shape):
                    continue
                probed += 1
                sent = self.sent[name].to(getattr(torch, dtype))
                if tensor_digest(sent) != digest:
                    mismatched.append(name)
        return SyncCheck(probed, tuple(mismatched))
