"""One tool call as a tool-sandbox worker process runs it: create, execute, release; plain data out.

The tool sandbox (:mod:`stages.agent.sandbox`) runs :func:`run_tool_call` as the "scorer" of a
reward scorer pool (:class:`stages.reward.pool.ScorerPool`), whose supervision bounds each call's
time, memory and output and replaces a worker that dies. The call follows verl's
``ToolAgentLoop._call_tool``: a fresh instance of the class (classes are imported once per
process and kept; instances never are), ``create(create_kwargs=...)``, ``execute(instance_id,
parameters)``, and ``release(instance_id)`` whatever happened; a method may be sync or async
(an awaitable is run on the process's own event loop).

What comes back is plain data (a dict with a finite ``score``, which the pool's wire carries):

- ``status``: ``ok``; ``error`` (the tool raised, or returned something that is not
  ``(response, reward, metrics)``); ``invalid`` (a response text over :data:`MAX_TEXT_CHARS`);
- ``score`` / ``has_reward``: the step reward ``execute`` returned (``score`` 0.0 and
  ``has_reward`` False when it returned None or the call failed);
- ``text``: the tool turn's text ("" on failure); ``metrics``: ``execute``'s metrics dict
  (plain data; {} for None);
- ``error``: "" when ok; else what the tool turn says after "Error when executing tool: "
  (``str(exception)``, verl's wording, or what was wrong with the result), with ``error_type``
  (the exception's type name) and ``detail`` (type, message, innermost frame) for the logs;
- ``seconds``: the call's time in this process.

A tool's exception, ``MemoryError`` included (the sandbox's memory bound), is that call's error:
the sandbox gives each call a fresh process, so nothing of a failed call is reused. Imports only
the standard library and :mod:`stages.agent.tool_api` (:mod:`stages.agent.tool_config` on a
class's first use in a process the sandbox did not preload).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import time
import traceback
from collections.abc import Mapping
from typing import Any

from stages.agent.tool_api import OpenAIFunctionToolSchema

ERROR_PREFIX = "Error when executing tool: "  # verl's ToolAgentLoop._call_tool wording
MEDIA_ATTRIBUTES = ("image", "video")
#: a response text longer than this is refused here (the wire carries at most 4 MiB per result,
#: and encoding 100 MB would take seconds of the call's time); verl cuts tool turns far shorter
#: (``multi_turn.max_tool_response_length``)
MAX_TEXT_CHARS = 1 << 20
_CLASSES: dict[str, type] = {}  # this process's tool classes, by class_name as configured


def remember_classes(classes: Mapping[str, type]) -> None:
    """Keep ``{class_name: class}`` for this process and the workers forked from it (the
    sandbox's zygote calls it with :func:`stages.agent.tool_config.check_tool_classes`)."""
    _CLASSES.update(classes)


def run_tool_call(
    class_name: str,
    config: dict[str, Any],
    schema: dict[str, Any],
    parameters: dict[str, Any],
    create_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Run one call of the tool ``class_name`` and return its outcome as plain data (module doc).

    Never raises for the tool's failure (its exception, a wrong return value): that is the
    ``error`` of the result. ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``) propagates: the pool counts the worker as died. Async methods run on
    this process's own event loop, so call it where no loop is running (a sandbox worker).

    Example:
        >>> out = run_tool_call(
        ...     "stages.agent.tools.lookup.LookupTool",
        ...     {"type": "native", "table": {"paris": "France"}},
        ...     {"type": "function", "function": {"name": "lookup"}},
        ...     {"key": "paris"},
        ...     {},
        ... )
        >>> out["status"], out["text"], out["has_reward"]
        ('ok', 'France', False)
    """
    started = time.monotonic()
    try:
        cls = _tool_class(class_name)
        tool = cls(config=config, tool_schema=OpenAIFunctionToolSchema.from_dict(schema))
        text, reward, metrics = _call(tool, parameters, create_kwargs)
    except Exception as exc:
        outcome = _failure(exc)
    else:
        outcome = _success(text, reward, metrics)
    return outcome | {"seconds": time.monotonic() - started}


def _success(text: str, reward: float | None, metrics: dict[str, Any]) -> dict[str, Any]:
    if len(text) > MAX_TEXT_CHARS:
        why = (
            f"the tool's response is {len(text)} characters, over the bound {MAX_TEXT_CHARS} "
            "on one response (tool_worker.MAX_TEXT_CHARS)"
        )
        return _outcome("invalid", error=why, detail=why)
    return _outcome("ok", reward, text, metrics)


def _outcome(
    status: str,
    reward: float | None = None,
    text: str = "",
    metrics: dict[str, Any] | None = None,
    *,
    error: str = "",
    error_type: str = "",
    detail: str = "",
) -> dict[str, Any]:
    return {
        "status": status,
        "score": 0.0 if reward is None else reward,
        "has_reward": reward is not None,
        "text": text,
        "metrics": metrics or {},
        "error": error,
        "error_type": error_type,
        "detail": detail,
    }


def _tool_class(class_name: str) -> type:
    cls = _CLASSES.get(class_name)
    if cls is None:
        from stages.agent.tool_config import resolve_tool_class

        cls = _CLASSES[class_name] = resolve_tool_class(class_name)
    return cls


def _call(
    tool: Any, parameters: dict[str, Any], create_kwargs: dict[str, Any]
) -> tuple[str, float | None, dict[str, Any]]:
    """create / execute / release on ``tool``; (text, reward, metrics) or a raise."""
    created = _settle(tool.create(create_kwargs=create_kwargs))
    if not (isinstance(created, tuple | list) and len(created) == 2):
        raise TypeError(
            f"create() returned {_describe(created)}; expected (instance_id, ToolResponse)"
        )
    instance_id = created[0]
    try:
        result = _settle(tool.execute(instance_id, parameters))
    finally:
        if instance_id:  # verl releases only an instance that was created
            _settle(tool.release(instance_id))
    return _read_result(result)


def _read_result(result: Any) -> tuple[str, float | None, dict[str, Any]]:
    """``execute``'s ``(response, reward, metrics)`` (or a bare response) checked."""
    response, reward, metrics = (
        result if isinstance(result, tuple) and len(result) == 3 else (result, None, None)
    )
    text = _response_text(response)
    if reward is not None:
        is_number = isinstance(reward, numbers.Real) and not isinstance(reward, str)
        if not is_number or not math.isfinite(reward):
            raise TypeError(
                f"execute() returned the reward {_describe(reward)}; expected a finite number "
                "or None"
            )
        reward = float(reward)
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, dict):
        raise TypeError(f"execute() returned the metrics {_describe(metrics)}; expected a dict")
    return text, reward, metrics


def _response_text(response: Any) -> str:
    """The text of a ToolResponse (or any object with ``text``) or of a str; images and videos
    (verl's multimodal responses) are refused."""
    if isinstance(response, str):
        return response
    if not hasattr(response, "text"):
        raise TypeError(
            f"execute() returned {_describe(response)}; expected (ToolResponse or str, reward, "
            "metrics)"
        )
    if any(getattr(response, name, None) for name in MEDIA_ATTRIBUTES):
        raise TypeError(
            "execute() returned a response with images/videos; images/videos in tool responses "
            "are not supported (ppoflow's tool turns are text only)"
        )
    text = response.text
    if text is None:
        return ""
    if not isinstance(text, str):
        raise TypeError(f"execute() returned a response whose text is {_describe(text)}")
    return text


def _settle(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (on this process's loop)."""
    if not inspect.isawaitable(value):
        return value
    return _runner().run(_await(value))


@functools.cache
def _runner() -> asyncio.Runner:
    """This process's event loop for async tools (one, so create / execute / release share it)."""
    return asyncio.Runner()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _failure(exc: Exception) -> dict[str, Any]:
    """The result of a failed call; the exception's frames (and what they hold) are let go."""
    if isinstance(exc, MemoryError):
        exc.__traceback__ = None  # first: its frames may hold what filled the memory
        error = "out of memory (MemoryError: the tool sandbox's memory bound was reached)"
        return _outcome("error", error=error, error_type="MemoryError", detail=error)
    frames = traceback.extract_tb(exc.__traceback__)
    exc.__traceback__ = None
    where = (
        f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    )
    detail = f"{type(exc).__name__}: {exc}{where}"
    return _outcome("error", error=str(exc), error_type=type(exc).__name__, detail=detail[:4000])


def _describe(value: Any) -> str:
    text = repr(value)
    return f"a {type(value).__name__} ({text[:80]}{'…' if len(text) > 80 else ''})"


__all__ = ["ERROR_PREFIX", "MAX_TEXT_CHARS", "remember_classes", "run_tool_call"]
