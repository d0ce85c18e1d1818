"""Load-time check that every row of a split can be scored: its route has a scorer.

A row's route is the value the scorer receives as ``data_source``: the ``data_source`` column,
or the ``data.reward_fn_key`` column when that names another one (``PromptRow.reward_route``).
With the built-in router (no ``reward.custom_reward_function.path``) every route must be a
name of ``stages.reward.scorers.registry``; otherwise the run would find an unknown name only
when a batch holding its row is scored, possibly many steps in. A custom scorer routes by
itself (a name it does not know fails in it, and is counted), and a run scored by the reward
model alone reads no route, so neither is checked here.

Every other field a scorer reads is checked for every row by ``stages.data.dataset`` itself:
the prompt column (the prompt the rollout continues, decoded for scorers that take
``prompt_str``) and ``reward_model.ground_truth`` (passed to every scorer as ``ground_truth``).
"""

from __future__ import annotations

from collections.abc import Sequence

from stages.data.dataset import PromptRow
from stages.reward.scorers.registry import get_scorer


class UnscoredRouteError(KeyError):
    """A route no built-in scorer handles. Its ``str()`` is the message itself (a plain
    ``KeyError`` prints its message in quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def row_route(row: PromptRow) -> str:
    """The value the scorer gets as ``data_source`` for ``row``."""
    return row.reward_route if row.reward_route is not None else row.data_source


def check_routes(rows: Sequence[PromptRow], route_column: str = "data_source") -> None:
    """Raise, naming the first row of each problem, if a row's route has no built-in scorer.

    Args:
        rows: the rows of one split (with their origins).
        route_column: the column the routes come from (``data.reward_fn_key``), for the message.

    Raises:
        UnscoredRouteError: a ``KeyError``, a route no built-in scorer handles (the message
            lists the known ones).
        NotImplementedError: a verl data_source whose scorer ppoflow does not ship.

    Example:
        >>> from stages.data.dataset import RowOrigin
        >>> row = PromptRow([{"role": "user", "content": "q"}], "my/task", {"ground_truth": "1"},
        ...                 origin=RowOrigin("train.jsonl", 4, 5))
        >>> try:
        ...     check_routes([row])
        ... except KeyError as err:
        ...     print(str(err).split("; known")[0])
        train.jsonl, row 4 (line 5): column 'data_source' = 'my/task' has no reward scorer
    """
    first_row: dict[str, PromptRow] = {}
    for row in rows:
        first_row.setdefault(row_route(row), row)
    for route, row in first_row.items():
        try:
            get_scorer(route)
        except (KeyError, NotImplementedError) as err:
            reason = str(err.args[0] if err.args else err)
            where = row.origin if row.origin is not None else "a row"
            if isinstance(err, KeyError):  # the registry's line names the route again
                known = reason.split("; ", 1)[-1]
                raise UnscoredRouteError(
                    f"{where}: column {route_column!r} = {route!r} has no reward scorer; {known}"
                ) from None
            raise NotImplementedError(
                f"{where}: column {route_column!r} = {route!r} has no reward scorer: {reason}"
            ) from None
