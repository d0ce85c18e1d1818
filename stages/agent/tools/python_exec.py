"""Run model-written Python: the code-execution tool (what verl's ``SandboxFusionTool`` does with
a remote sandbox service, done here in the tool sandbox's own process).

The code is compiled as ``<code>`` and run with ``exec`` in a fresh namespace (``__name__`` is
``"__main__"``), with ``sys.stdout`` and ``sys.stderr`` captured together, up to
``max_output_chars`` characters (config; the rest is counted and replaced by one line). The text
is what it printed, followed by the exception's last line when it raised
(``ZeroDivisionError: division by zero``), as a terminal would end; ``exit()`` ends it quietly.
No step reward and no metrics, as verl's tool.

The process is the sandbox's: the call's time, memory and network are bounded there
(:mod:`stages.agent.sandbox`), and a call that kills its process (``os._exit``, a segfault) is
that call's error. Writes to file descriptors 1 and 2 below ``sys.stdout`` (C code,
``os.write``) are not captured; they reach the run's log under the sandbox's output bound.

Config (verl's ``sandbox_fusion`` keys are accepted and ignored, except ``default_language``):
``max_output_chars`` (default 10000). Parameters: ``code`` (str); ``language`` (optional, only
``python``).

Example:
    >>> import asyncio
    >>> schema = {"type": "function", "function": {"name": "code_interpreter"}}
    >>> tool = PythonExecTool({"type": "native"}, schema)
    >>> run = lambda code: asyncio.run(tool.execute("id", {"code": code}))[0].text
    >>> run("print(6 * 7)")
    '42\\n'
    >>> run("print('a'); 1 / 0")
    'a\\nZeroDivisionError: division by zero'
"""

from __future__ import annotations

import builtins
import contextlib
import io
import traceback
from typing import Any

from stages.agent.tool_api import BaseTool, ToolResponse

DEFAULT_MAX_OUTPUT_CHARS = 10_000
LANGUAGE = "python"


class BoundedText(io.TextIOBase):
    """A text stream that keeps the first ``limit`` characters written and counts the rest.

    >>> out = BoundedText(5)
    >>> print("hello world", file=out)
    >>> out.text()
    'hello\\n…(output truncated: 7 more characters)'
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.kept
        if room > 0:
            self._parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(len(text) - max(room, 0), 0)
        return len(text)

    def text(self) -> str:
        """What was kept, plus one line counting what was dropped."""
        kept = "".join(self._parts)
        if self.dropped:
            kept += f"\n…(output truncated: {self.dropped} more characters)"
        return kept


class PythonExecTool(BaseTool):
    """Runs ``parameters["code"]`` with ``exec`` and answers with its output (module docstring).

    Raises:
        ValueError: ``max_output_chars`` is not a positive int.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.max_output_chars = config.get("max_output_chars", DEFAULT_MAX_OUTPUT_CHARS)
        if type(self.max_output_chars) is not int or self.max_output_chars < 1:
            raise ValueError(
                f"tool {self.name!r}: config.max_output_chars is {self.max_output_chars!r}; "
                "expected a positive int (characters)"
            )
        self.default_language = config.get("default_language", LANGUAGE)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, None, dict]:
        code = parameters.get("code", "")
        if not isinstance(code, str):
            code = str(code)
        language = parameters.get("language", self.default_language)
        if language != LANGUAGE:
            raise ValueError(f"language {language!r} is not supported; this tool runs {LANGUAGE}")
        return ToolResponse(text=run_code(code, self.max_output_chars)), None, {}


def run_code(code: str, max_output_chars: int) -> str:
    """Output of ``exec(code)`` in a fresh namespace (bounded), then its exception's last line."""
    output = BoundedText(max_output_chars)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    ending = ""
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            exec(compile(code, "<code>", "exec"), namespace)
        except SystemExit as exc:
            ending = "" if exc.code in (None, 0) else f"SystemExit: {exc.code}"
        except Exception as exc:
            ending = traceback.format_exception_only(exc)[-1].rstrip("\n")
    text = output.text()
    return text + ending if not ending or not text or text.endswith("\n") else f"{text}\n{ending}"
