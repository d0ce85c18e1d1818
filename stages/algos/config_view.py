"""Read algorithm settings from whatever config object the caller holds (verl's API).

The estimators and KL controllers accept verl-style configs: a pydantic model or dataclass with the
right attribute names, an OmegaConf ``DictConfig``, a plain ``Mapping``, or ``None``. This module is
the one place that knows how to read a field from any of them. A field the config does not hold
takes its default (:func:`algorithm_defaults`, from the tables in :mod:`stages.algos.defaults`,
which the run config's ``algorithm`` schema takes its defaults from too), so no second table of
defaults exists and no ``cfg.get(x, default)`` is scattered around the math. ppoflow's own stages
pass the typed ``algorithm`` slice of the run config, which holds every field.

Example:
    >>> read_field({"gamma": 0.99}, "gamma")
    0.99
    >>> read_field(None, "lam")
    1.0
    >>> layered = with_overrides({"gamma": 0.99}, lam=0.95)
    >>> read_field(layered, "gamma"), read_field(layered, "lam")
    (0.99, 0.95)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from stages.algos.defaults import (
    ALGORITHM_DEFAULTS,
    FILTER_GROUPS_DEFAULTS,
    KL_CTRL_DEFAULTS,
    ROLLOUT_CORRECTION_DEFAULTS,
)

_MISSING = object()


@functools.cache
def algorithm_defaults() -> Mapping[str, Any]:
    """The default of every ``algorithm.*`` and ``algorithm.<section>.*`` leaf, by leaf name.

    The tables of :mod:`stages.algos.defaults` in the schema's order (``kl_ctrl.kl_coef`` is
    ``"kl_coef"``: the KL controllers receive the ``kl_ctrl`` section itself).
    """
    defaults: dict[str, Any] = {}
    tables = (
        ALGORITHM_DEFAULTS,
        KL_CTRL_DEFAULTS,
        ROLLOUT_CORRECTION_DEFAULTS,
        FILTER_GROUPS_DEFAULTS,
    )
    for table in tables:
        for leaf, value in table.items():
            assert leaf not in defaults, f"algorithm leaf {leaf!r} is not unique"
            defaults[leaf] = value
    return MappingProxyType(defaults)


def read_field(config: Any, name: str) -> Any:
    """``config.name`` or ``config[name]``; a ``None`` config or an absent field gives the field's
    default (:func:`algorithm_defaults`).

    Raises ``KeyError`` when the field is absent and has no default (no such ``algorithm`` field:
    a bug in the caller).
    """
    value = _lookup(config, name)
    if value is not _MISSING:
        return value
    defaults = algorithm_defaults()
    if name in defaults:
        return defaults[name]
    raise KeyError(
        f"config field {name!r} is missing from {type(config).__name__} and the algorithm schema "
        f"has no such field; known: {sorted(defaults)}"
    )


def sets_verl_only_flag(config: Any, name: str) -> bool:
    """Whether ``config`` sets ``name`` true: for a verl key that ppoflow's schema does not have
    (so it has no default), such as ``use_pf_ppo``, which ppoflow then refuses.

    >>> sets_verl_only_flag({"use_pf_ppo": True}, "use_pf_ppo"), sets_verl_only_flag(None, "use_pf_ppo")
    (True, False)
    """
    value = _lookup(config, name)
    return value is not _MISSING and bool(value)


def _lookup(config: Any, name: str) -> Any:
    if config is None:
        return _MISSING
    if isinstance(config, Mapping):
        return config.get(name, _MISSING)
    return getattr(config, name, _MISSING)


class ConfigOverlay(Mapping[str, Any]):
    """A read-only view: explicit ``overrides`` first, then the wrapped ``base`` config.

    Supports both access styles (``view.gamma`` and ``view["gamma"]`` / ``view.get``), so verl-style
    custom estimators that read their config either way keep working.
    """

    def __init__(self, base: Any, overrides: Mapping[str, Any]) -> None:
        self._base = base
        self._overrides = dict(overrides)

    def __getitem__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        value = _lookup(self._base, name)
        if value is _MISSING:
            raise KeyError(name)
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no field {name!r}") from None

    def _base_keys(self) -> list[str]:
        if isinstance(self._base, Mapping):
            return list(self._base)
        if self._base is None:
            return []
        return [k for k in getattr(self._base, "__dict__", {}) if not k.startswith("_")]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._overrides, *self._base_keys()]))

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"ConfigOverlay(overrides={self._overrides!r}, base={self._base!r})"


def with_overrides(config: Any, **overrides: Any) -> Any:
    """``config`` with the non-``None`` ``overrides`` layered on top; ``config`` itself if there are none.

    An override that disagrees with a value the config already sets raises ``ValueError``: the
    two would silently compete (verl reads one or the other depending on the estimator).
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    if not given:
        return config
    for name, value in given.items():
        existing = _lookup(config, name)
        if existing is not _MISSING and existing != value:
            raise ValueError(
                f"{name} is given twice with different values: {name}={value!r} as an argument and "
                f"{existing!r} in config; pass it in one place only"
            )
    return ConfigOverlay(config, given)
