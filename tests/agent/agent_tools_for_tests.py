"""Tool classes for the tool and sandbox tests: each one behaves well or fails in one named way.

The sandbox imports them by class path (``agent_tools_for_tests.<Class>``) in its zygote, with
this directory on ``sys.path``; the test process itself imports them only for in-process tests.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import uuid
from typing import Any

from stages.agent.tool_api import BaseTool, ToolResponse


class SyncEcho:
    """Duck-typed (no BaseTool), sync methods: echoes ``text`` with the create_kwargs' ``tag``;
    reward 0.5 and a metric."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        self.config = config
        self.tags: dict[str, str] = {}

    def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, None]:
        instance_id = instance_id or uuid.uuid4().hex
        self.tags[instance_id] = kwargs.get("create_kwargs", {}).get("tag", "")
        return instance_id, None

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        text = f"{self.tags[instance_id]}{parameters.get('text', '')}"
        return ToolResponse(text=text), 0.5, {"chars": len(text)}

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    def release(self, instance_id: str, **kwargs: Any) -> None:
        del self.tags[instance_id]


class AsyncEcho(BaseTool):
    """BaseTool subclass with async execute that awaits; returns a bare str (no reward)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        await asyncio.sleep(0)
        return f"async:{parameters.get('text', '')}"


class Sleep(BaseTool):
    """Sleeps ``seconds`` and answers ``"<start> <end>"`` (``time.monotonic``, system-wide)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        start = time.monotonic()
        await asyncio.sleep(float(parameters["seconds"]))
        return ToolResponse(text=f"{start} {time.monotonic()}"), None, {}


class Hang(BaseTool):
    """Never returns (a sync sleep: the event loop cannot help)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        time.sleep(3600)


class Raise(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise ValueError(f"bad input {parameters.get('x')!r}")


class Exit(BaseTool):
    """Kills its own process with exit code 3."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        os._exit(3)


class NonString(BaseTool):
    """Returns a list where a response belongs."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return [1, 2, 3], None, {}


class WithImage(BaseTool):
    """Returns a verl-style response carrying an image."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        class Response:
            def __init__(self) -> None:
                self.text, self.image, self.video = "see picture", ["<an image>"], None

        return Response(), None, {}


class Huge(BaseTool):
    """Returns ``megabytes`` MB of text."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return "x" * (int(parameters["megabytes"]) << 20), None, {}


class Connect(BaseTool):
    """Connects to ``host``:``port`` over TCP and answers "connected"."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        with socket.create_connection((parameters["host"], int(parameters["port"])), timeout=2):
            return "connected", None, {}


class Allocate(BaseTool):
    """Allocates ``megabytes`` MB and touches them."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        block = bytearray(int(parameters["megabytes"]) << 20)
        return f"allocated {len(block)}", None, {}


class Chatty(BaseTool):
    """Prints ``megabytes`` MB to its process's stdout, then answers "printed"."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        line = "y" * 1023 + "\n"
        for _ in range(int(parameters["megabytes"]) << 10):
            sys.stdout.write(line)
        sys.stdout.flush()
        return "printed", None, {}


class Pid(BaseTool):
    """Answers its process id; counts calls in a module global (a reused process would show)."""

    calls = 0

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        type(self).calls += 1
        return f"{os.getpid()} {type(self).calls}", None, {}


class NoExecute:
    """Lacks execute: refused at the sandbox's start."""

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        pass

    def create(self, instance_id: str | None = None, **kwargs: Any):
        return "id", None

    def release(self, instance_id: str, **kwargs: Any) -> None:
        pass


class BigMetrics(BaseTool):
    """A short text with ``megabytes`` MB of metrics: over the wire's bound on one result."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return "small", None, {"blob": "z" * (int(parameters["megabytes"]) << 20)}


class BadReward(BaseTool):
    """Returns a NaN step reward."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return "nan reward", float("nan"), {}


class HangingInteraction:
    """An interaction whose answer never comes (the sandbox's timeout must end it)."""

    def __init__(self, config):
        self.config = config

    async def start_interaction(self, instance_id=None, **kwargs):
        return "hanging"

    async def generate_response(self, instance_id, messages, **kwargs):
        time.sleep(3600)

    async def finalize_interaction(self, instance_id, **kwargs):
        return None
