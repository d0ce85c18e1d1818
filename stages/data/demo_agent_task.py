"""The built-in multi-turn demo "ppoflow/demo-lookup": answer a key's secret value, asked of a tool.

Each prompt is one user message ``"key: <k>"``, ``k`` a letter of ``KEYS``. Every row has its
own secret table (each key of ``KEYS`` ↦ a letter of ``VALUES``, drawn per row), handed to the
``lookup`` tool through the row's ``extra_info.tools_kwargs`` (verl's ``create_kwargs``) and to
nobody else: the answer ``table[k]`` is obtainable only by calling the tool with the right key.
The call format is ``lookup_word`` (:mod:`stages.agent.parsers_compact`): a turn that is one
word calls ``lookup`` with it. With the tiny tokenizer the ideal trajectory reads

    <|user|>key: c<|assistant|>c<|endoftext|><|tool|>a<|assistant|>a<|endoftext|>

where ``c<|endoftext|>`` and ``a<|endoftext|>`` are sampled (mask 1) and ``<|tool|>a<|assistant|>``
is the tool turn (mask 0): 14 response tokens. ``max_assistant_turns: 2`` ends the trajectory
after the answer (the loop does not parse the last allowed turn, so a one-word answer is no call).

Score (``compute_score``, verl's custom-reward signature, returns ``{"score", "acc", "pred"}``).
The reward loop decodes the response with special tokens skipped, so the scorer sees
``t1 + "<|tool|>" + tool_text + t2`` (t1 the call turn, t2 the answer turn) when a tool turn
ran, else ``t1`` alone; it rebuilds ``tool_text`` from the row's table and t1's key
(:func:`split_turns`; the tool is deterministic). With ``copy(s, x)`` the copy demo's score of a
text s for the one-letter answer x over the alphabet ``KEYS`` (:func:`copy_credit`: every visible
character against x, 1 for x, 0.25 for a cyclic neighbour, 0 for the opposite letter, 0.8×
unless s is exactly one character) and V = ``table[k]``:

- ``call`` = copy(t1, k) / max(1, len(t1)): the key, and every visible character past one
  dilutes it;
- ``ran`` = 1 when a tool turn followed t1 (t1 was one word *and* ended at EOS in time), else 0;
- ``faithful`` = copy(t2, tool_text) when the tool answered a letter, else 0;
  ``correct`` = copy(t2, V); both 0 without a tool turn;
- ``score`` = 0.3·call + 0.1·ran + 0.2·faithful + 0.4·correct (``WEIGHTS``);
- ``acc`` = 1.0 when the tool was called with k and t2 starts with V (success), ``pred`` = t2[:1].

So the ideal trajectory scores 1.0. A policy that calls one fixed key whatever the prompt, then
copies the tool's value faithfully, scores 0.5625 on average (0.3·0.375 + 0.1 + 0.2 + 0.4·0.375,
0.375 being a random letter's expected credit) and succeeds 1/4 of the time (greedy validation
shows this plateau as acc 0.250, score 0.616 on the 64 validation rows). One that writes the
same letter in both turns, whatever it reads, scores 0.4375 and succeeds 1/16 of the time.

Why this shape (GRPO, n = 4, on a *randomly initialised* tiny model, as the copy demo); each
rejected variant was run with configs/demo-agent-cpu.yaml:
- Four keys and values, not the copy demo's eight. With eight letters (the first version) the
  policy found the tool in 100 steps but learned the two copies slowly and stopped short:
  greedy success 0.297 (score 0.649) from step 350 to step 650. With eight letters and the
  answer scored over a window of 8 repeated letters (denser copy signal, 24 response tokens)
  success was 0.031 at step 260. With four, both copies are learned by step 180–220 (measured
  below, two seeds).
- A call a random policy can find. hermes' JSON call is 57 tokens, never sampled. ``c?`` (a
  key then a question mark) was tried first: with credit for ``?`` anywhere the policy wrote
  ``?`` at every position; with credit for ``?`` right after the key only, the call was still
  unfound at step 100. A one-word turn is a call as soon as the policy writes letters, which
  it learns first (as in the copy demo).
- The turn must *end* (EOS) for the tool to run, and stopping is what the copy demo never
  learns (its responses fill the budget). ``call`` is diluted by visible length, so an early
  EOS pays at once; without the dilution EOS vanished (every response hit the budget, step
  170). The dilution is blind to special tokens (decoded as nothing): a length-only bonus was
  gamed by emitting ``<|system|>`` / ``<|assistant|>`` runs, or an immediate EOS. Here ``call``
  needs the key letter and ``ran`` needs a real EOS, which only that token gives.
- One circuit serves both copies. The key is the token right before the prompt's
  ``<|assistant|>``, the tool's value the token right before the tool turn's ``<|assistant|>``,
  in one alphabet: "emit the token before the last ``<|assistant|>``, then EOS" is the whole
  policy, in both turns.
- ``faithful`` pays for copying the tool's value even when the key was wrong: without it the
  copy pays only in the 1/4 of trajectories that called the right key. ``correct`` has the
  largest weight, so the optimum is the right key *and* its value.
- ``entropy_coeff: 0.01``: without it the eight-letter policy collapsed onto one letter
  everywhere (step 236: every sample ``d``, ``d``).

Measured (greedy validation on the 64 validation prompts every 20 steps, 64 prompts × 4 per
step, lr 3e-4) — the shipped run and a second seed are in docs/agents.md; the wall minutes
and machine load are in bench/README.md.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from stages.agent.parsers_compact import ARGUMENT, TOOL_NAME, called_key
from stages.agent.tool_api import BaseTool, ToolResponse
from stages.agent.tools.lookup import UNKNOWN_KEY
from stages.data import demo_task

DATA_SOURCE = "ppoflow/demo-lookup"
ABILITY = "tool-use"
KEYS = "abcd"
VALUES = KEYS  # one alphabet: the same copy circuit writes the key and the value
AGENT_NAME = "tool_agent"
CALL_FORMAT = "lookup_word"
#: the tiny tokenizer's chat template renders a tool message as ``<|tool|>content`` (bytes)
TOOL_MARK = "<|tool|>"
TOOLS_FILE = "tools.yaml"
WEIGHTS = {"call": 0.3, "ran": 0.1, "faithful": 0.2, "correct": 0.4}
#: the share of its copy credit a turn keeps when it is not exactly one character (copy_credit)
NO_STOP_SHARE = 0.8


class RowTableLookup(BaseTool):
    """``lookup`` over the *row's* table: ``create_kwargs={"table": {key: value}}`` (each row's
    ``extra_info.tools_kwargs.lookup.create_kwargs``); ``key`` → its value, else ``unknown key``.

    Example:
        >>> import asyncio
        >>> tool = RowTableLookup({"type": "native"}, {"type": "function", "function": {"name": "lookup"}})
        >>> async def call(key):
        ...     instance_id, _ = await tool.create(create_kwargs={"table": {"a": "h"}})
        ...     return (await tool.execute(instance_id, {"key": key}))[0].text
        >>> asyncio.run(call("a")), asyncio.run(call("z"))
        ('h', 'unknown key')
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.tables: dict[str, dict[str, str]] = {}

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        table = (kwargs.get("create_kwargs") or {}).get("table")
        if not isinstance(table, dict):
            raise ValueError(
                f"tool {self.name!r}: create_kwargs.table is {type(table).__name__}; expected the "
                "row's {key: value} mapping (extra_info.tools_kwargs.lookup.create_kwargs.table)"
            )
        self.tables[instance_id] = {str(k): str(v) for k, v in table.items()}
        return instance_id, response

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, None, dict]:
        value = self.tables[instance_id].get(str(parameters.get(ARGUMENT, "")), UNKNOWN_KEY)
        return ToolResponse(text=value), None, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.tables.pop(instance_id, None)


def split_turns(solution_str: str, table: dict[str, str]) -> tuple[str, str | None, str | None]:
    """``(t1, tool_text, t2)`` of a decoded response; ``(t1, None, None)`` without a tool turn.

    The tool text is rebuilt from t1's first call and the row's table (the tool is
    deterministic); a response whose text after ``<|tool|>`` does not start with it keeps it all
    in t2.

    Example:
        >>> split_turns("c<|tool|>ff", {"c": "f"}), split_turns("zz", {"c": "f"})
        (('c', 'f', 'f'), ('zz', None, None))
        >>> split_turns("q<|tool|>unknown keyx", {"c": "f"})
        ('q', 'unknown key', 'x')
    """
    t1, marker, rest = solution_str.partition(TOOL_MARK)
    if not marker:
        return t1, None, None
    key = called_key(t1)
    tool_text = table.get(key, UNKNOWN_KEY) if key is not None else UNKNOWN_KEY
    return t1, tool_text, rest[len(tool_text) :] if rest.startswith(tool_text) else rest


def copy_credit(text: str, letter: str) -> float:
    """The copy credit of ``text`` for the one-letter answer ``letter``: every visible character
    against it (``demo_task.copy_match``: cyclic near-miss credit over ``KEYS``), times
    :data:`NO_STOP_SHARE` unless ``text`` is that one character long. (The copy demo's own
    scorer grades the length instead; this task was measured with this rule.)

    Example:
        >>> copy_credit("c", "c"), copy_credit("cc", "c"), copy_credit("d", "c"), copy_credit("", "c")
        (1.0, 0.8, 0.25, 0.0)
    """
    match = demo_task.copy_match(text, letter, KEYS)
    return match if len(text) == 1 else NO_STOP_SHARE * match


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **_: Any
) -> dict[str, Any]:
    """Score one multi-turn response (rules in the module docstring).

    Example:
        >>> info = {"key": "c", "tools_kwargs": {"lookup": {"create_kwargs": {"table": {"c": "a", "a": "b"}}}}}
        >>> compute_score(DATA_SOURCE, "c<|tool|>aa", "a", info)
        {'score': 1.0, 'acc': 1.0, 'pred': 'a'}
        >>> round(compute_score(DATA_SOURCE, "a<|tool|>bb", "a", info)["score"], 4)  # wrong key
        0.4
        >>> out = compute_score(DATA_SOURCE, "a", "a", info)  # the right value, but no tool call
        >>> round(out["score"], 5), out["acc"]
        (0.0, 0.0)
    """
    if data_source != DATA_SOURCE:
        raise ValueError(
            f"agent demo scorer got data_source={data_source!r}; it scores {DATA_SOURCE!r}"
        )
    info = extra_info or {}
    key, table = info.get("key"), _row_table(info)
    if key not in table or str(ground_truth) != table[key]:
        raise ValueError(
            f"agent demo scorer got key={key!r}, ground_truth={ground_truth!r}; expected a key of "
            f"the row's table {table!r} and its value"
        )
    t1, tool_text, t2 = split_turns(solution_str, table)
    call = copy_credit(t1, key) / max(1, len(t1))  # every visible character past one dilutes it
    parts = {"call": call, "ran": 0.0, "faithful": 0.0, "correct": 0.0}
    if tool_text is not None:
        parts["ran"] = 1.0
        if len(tool_text) == 1 and tool_text in VALUES:
            parts["faithful"] = copy_credit(t2, tool_text)
        parts["correct"] = copy_credit(t2, table[key])
    score = sum(WEIGHTS[name] * value for name, value in parts.items())
    pred = (t2 or "")[:1]
    success = tool_text is not None and called_key(t1) == key and pred == table[key]
    return {"score": score, "acc": float(success), "pred": pred}


def _row_table(extra_info: dict[str, Any]) -> dict[str, str]:
    kwargs = (extra_info.get("tools_kwargs") or {}).get(TOOL_NAME) or {}
    table = (kwargs.get("create_kwargs") or {}).get("table") or {}
    return {str(k): str(v) for k, v in table.items()}


def make_agent_demo_rows(n: int, *, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` verl-layout records of the task, drawn from ``random.Random(seed)``: per row a key,
    then its table (each key ↦ a letter of ``VALUES``).

    Example:
        >>> row = make_agent_demo_rows(1, seed=0, split="train")[0]
        >>> row["prompt"], row["reward_model"]["ground_truth"] == row["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]["table"][row["extra_info"]["key"]]
        ([{'role': 'user', 'content': 'key: d'}], True)
    """
    if n < 0:
        raise ValueError(f"need n >= 0 rows, got n={n}")
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        key = rng.choice(KEYS)
        table = {k: rng.choice(VALUES) for k in KEYS}
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"key: {key}"}],
                "ability": ABILITY,
                "agent_name": AGENT_NAME,
                "reward_model": {"style": "rule", "ground_truth": table[key]},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "key": key,
                    "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"table": table}}},
                },
            }
        )
    return rows


def tool_config_text() -> str:
    """The verl tool-config YAML of the task: the one ``lookup`` tool over each row's table."""
    return (
        "# The agent demo's tool (stages/data/demo_agent_task.py): each row's secret table comes\n"
        "# from its extra_info.tools_kwargs.lookup.create_kwargs.table.\n"
        "tools:\n"
        f"  - class_name: {__name__}.{RowTableLookup.__name__}\n"
        "    config:\n"
        "      type: native\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        f"        name: {TOOL_NAME}\n"
        "        description: The value of a key in this conversation's secret table.\n"
        "        parameters:\n"
        "          type: object\n"
        "          properties:\n"
        f"            {ARGUMENT}: {{type: string, description: 'a key, one of {KEYS}'}}\n"
        f"          required: [{ARGUMENT}]\n"
    )


def make_agent_demo_data(
    directory: str | Path, *, n_train: int = 1024, n_val: int = 64, seed: int = 0
) -> tuple[Path, Path, Path]:
    """Write ``train.parquet``, ``val.parquet`` and the tool config ``tools.yaml``; return their
    paths. The splits are drawn from independent streams (seed and seed + 1)."""
    from stages.data.dataset import write_prompt_rows  # not in the scorer's workers (demo_task)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train, val, tools = (
        directory / "train.parquet",
        directory / "val.parquet",
        directory / TOOLS_FILE,
    )
    write_prompt_rows(train, make_agent_demo_rows(n_train, seed=seed, split="train"))
    write_prompt_rows(val, make_agent_demo_rows(n_val, seed=seed + 1, split="val"))
    tools.write_text(tool_config_text(), encoding="utf-8")
    return train, val, tools
