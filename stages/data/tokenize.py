"""Prompt tokenisation: chat template, truncation, overlong filtering, left padding → DataProto.

Text of a prompt (what the rollout continues):
- the tokenizer's chat template when it has one:
  ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``;
- otherwise the plain template `plain_template`: one ``"{role}: {content}\\n"`` line per message,
  then ``"assistant: "``.
The text is encoded with ``add_special_tokens=False`` (as verl does: the template already holds
every special token the model expects).

Length limit ``max_prompt_length`` (as verl's ``data.truncation``):
- ``error``: an overlong prompt is an error naming its row, its length and the limit;
- ``left``: keep the last ``max_prompt_length`` tokens;
- ``right``: keep the first ``max_prompt_length`` tokens;
- ``middle``: keep the first ``max_prompt_length // 2`` and the last
  ``max_prompt_length - max_prompt_length // 2`` tokens.
``filter_overlong_prompts`` drops overlong prompts before training (before any truncation) and
reports how many were dropped. Measuring a prompt means encoding it, so the encoding pass is the
filter: with ``num_workers`` > 1 (verl's ``filter_overlong_prompts_workers``, its ``num_proc``)
it runs in that many processes (`encode_prompts`), with the same ids in the same order.

Batch layout (the prompt DataProto the rollout stage reads), P = ``max_prompt_length`` by default
(as verl) or the longest prompt of the batch with ``pad_to_max_length=False``:
- ``input_ids`` (B, P) int64, left-padded with ``pad_token_id``;
- ``attention_mask`` (B, P) int64, 0 on padding, 1 on prompt tokens;
- ``position_ids`` (B, P) int64 = clip(cumsum(attention_mask) − 1, min=0): 0 on the left padding,
  then 0, 1, 2, … over the prompt (verl's ``compute_position_id_with_mask``);
- non-tensors (B,) object: ``raw_prompt`` (the messages; only with ``return_raw_chat``, verl's
  ``data.return_raw_chat``), ``data_source``, ``reward_model``, ``extra_info``, ``ability``,
  ``index`` (``extra_info["index"]``, 0 when absent, as verl), ``uid`` when every row of the
  dataset has one, and ``reward_route`` when ``data.reward_fn_key`` names a column other than
  ``data_source`` (`stages.data.dataset`).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from dataproto import keys
from dataproto.protocol import DataProto
from stages.data.dataset import PromptRow, as_path_list, load_prompt_rows, max_samples_indices

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")
INDEX = keys.INDEX
AGENT_NAME = "agent_name"  # (B,) object str | None: the row's agent loop (stages.agent.agents)
#: worker processes start from a clean server process (``fork`` after torch is unsafe)
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def plain_template(messages: Sequence[dict[str, Any]]) -> str:
    """The prompt text for a tokenizer without a chat template.

    Example:
        >>> plain_template([{"role": "system", "content": "Be brief."},
        ...                 {"role": "user", "content": "2+2?"}])
        'system: Be brief.\\nuser: 2+2?\\nassistant: '
    """
    lines = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return lines + "assistant: "


def render_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None
) -> str:
    """Chat template with the generation prompt when the tokenizer has one, else `plain_template`.

    ``tools``: OpenAI function schemas the template renders into the prompt (``tools=``, as
    verl's agent loop renders ``multi_turn.tool_config_path``'s tools); None or empty: none.
    """
    if getattr(tokenizer, "chat_template", None):
        extra = {"tools": list(tools)} if tools else {}
        return tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False, **extra
        )
    if tools:
        raise ValueError(
            "actor_rollout_ref.rollout.multi_turn.tool_config_path renders tool schemas with the "
            "tokenizer's chat template, and this tokenizer has none; use a tokenizer with a "
            "chat_template"
        )
    return plain_template(messages)


def encode_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict] | None = None
) -> list[int]:
    """Token ids of the rendered prompt (no special tokens added beyond the template's)."""
    return list(
        tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False)["input_ids"]
    )


_worker_tokenizer: Any = None  # the tokenizer of an encode_prompts worker process
_worker_tools: Any = None  # and the tool schemas it renders


def _init_encoder(tokenizer: Any, tools: Any = None) -> None:
    global _worker_tokenizer, _worker_tools
    _worker_tokenizer, _worker_tools = tokenizer, tools


def _encode_chunk(chats: list[list[dict[str, Any]]]) -> list[list[int]]:
    return [encode_prompt(_worker_tokenizer, messages, _worker_tools) for messages in chats]


def encode_prompts(
    tokenizer: Any,
    chats: Sequence[Sequence[dict[str, Any]]],
    num_workers: int = 1,
    tools: Sequence[dict] | None = None,
) -> list[list[int]]:
    """`encode_prompt` of every chat, in order; in ``num_workers`` processes when > 1.

    Each worker receives the tokenizer once and encodes contiguous chunks, so the ids are those
    of the serial pass, in the same order.

    Example:
        >>> class Chars:
        ...     chat_template = None
        ...     def __call__(self, text, add_special_tokens): return {"input_ids": [len(text)]}
        >>> encode_prompts(Chars(), [[{"role": "user", "content": "ab"}]])
        [[20]]
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1 process, got {num_workers}")
    if num_workers == 1 or len(chats) < 2:
        return [encode_prompt(tokenizer, messages, tools) for messages in chats]
    workers = min(num_workers, len(chats))
    size = -(-len(chats) // (4 * workers))  # about four chunks per worker
    chunks = [list(chats[i : i + size]) for i in range(0, len(chats), size)]
    with ProcessPoolExecutor(
        workers,
        mp.get_context(START_METHOD),
        initializer=_init_encoder,
        initargs=(tokenizer, tools),
    ) as pool:
        return [ids for chunk in pool.map(_encode_chunk, chunks) for ids in chunk]


def truncate_prompt_ids(
    ids: Sequence[int], max_length: int, truncation: str, *, label: str = "prompt"
) -> list[int]:
    """Cut ``ids`` to at most ``max_length`` tokens by the ``truncation`` mode.

    Example:
        >>> ids = list(range(7))
        >>> truncate_prompt_ids(ids, 4, "left"), truncate_prompt_ids(ids, 4, "right")
        ([3, 4, 5, 6], [0, 1, 2, 3])
        >>> truncate_prompt_ids(ids, 5, "middle")
        [0, 1, 4, 5, 6]
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation={truncation!r} is not one of {list(TRUNCATION_MODES)}")
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[-max_length:]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + ids[-tail:]  # tail >= 1 since max_length >= 1
    raise ValueError(
        f"{label}: prompt has {len(ids)} tokens, more than max_prompt_length={max_length}; "
        "raise data.max_prompt_length, set data.truncation to left/right/middle, or set "
        "data.filter_overlong_prompts=true"
    )


def left_pad(
    token_ids: Sequence[Sequence[int]], pad_token_id: int, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts to ``length`` → (input_ids, attention_mask, position_ids), each (B, P) int64.

    Example:
        >>> ids, mask, pos = left_pad([[7, 8, 9], [5]], pad_token_id=0, length=4)
        >>> ids.tolist(), mask.tolist(), pos.tolist()
        ([[0, 7, 8, 9], [0, 0, 0, 5]], [[0, 1, 1, 1], [0, 0, 0, 1]], [[0, 0, 1, 2], [0, 0, 0, 0]])
    """
    longest = max((len(ids) for ids in token_ids), default=0)
    if longest > length:
        raise ValueError(f"a prompt has {longest} tokens, more than the padded length {length}")
    input_ids = torch.full((len(token_ids), length), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(token_ids), length), dtype=torch.int64)
    for row, ids in enumerate(token_ids):
        if ids:
            input_ids[row, length - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.int64)
            attention_mask[row, length - len(ids) :] = 1
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)  # (B, P)
    return input_ids, attention_mask, position_ids


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """(B,) object array holding each value as is (lists and dicts are not broadcast)."""
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


@dataclass
class PromptDataset:
    """Validated rows with their token ids, ready to be collated into prompt DataProtos.

    ``num_filtered`` counts the rows dropped by ``filter_overlong_prompts``; ``return_raw_chat``
    puts the messages in every batch as ``raw_prompt``.
    """

    rows: list[PromptRow]
    token_ids: list[list[int]]
    pad_token_id: int
    max_prompt_length: int
    pad_to_max_length: bool = True
    num_filtered: int = 0
    return_raw_chat: bool = True

    def __len__(self) -> int:
        return len(self.rows)

    @cached_property
    def has_uid(self) -> bool:
        """Whether every row has a ``uid`` (then batches carry it as the prompt group id)."""
        return bool(self.rows) and all(r.uid is not None for r in self.rows)

    @cached_property
    def has_reward_route(self) -> bool:
        """Whether the rows carry a ``reward_route`` (``data.reward_fn_key`` is another column)."""
        return bool(self.rows) and all(r.reward_route is not None for r in self.rows)

    def collate(self, indices: Sequence[int]) -> DataProto:
        """The prompt DataProto of the rows at ``indices`` (layout in the module docstring)."""
        rows = [self.rows[i] for i in indices]
        ids = [self.token_ids[i] for i in indices]
        length = self.max_prompt_length
        if not self.pad_to_max_length:
            length = max((len(x) for x in ids), default=0)
        input_ids, attention_mask, position_ids = left_pad(ids, self.pad_token_id, length)
        tensors = {
            keys.INPUT_IDS: input_ids,
            keys.ATTENTION_MASK: attention_mask,
            keys.POSITION_IDS: position_ids,
        }
        non_tensors = {}
        if self.return_raw_chat:
            non_tensors[keys.RAW_PROMPT] = _object_array([r.prompt for r in rows])
        non_tensors |= {
            keys.DATA_SOURCE: _object_array([r.data_source for r in rows]),
            keys.REWARD_MODEL: _object_array([r.reward_model for r in rows]),
            keys.EXTRA_INFO: _object_array([r.extra_info for r in rows]),
            keys.ABILITY: _object_array([r.ability for r in rows]),
            INDEX: _object_array([r.extra_info.get("index", 0) for r in rows]),
        }
        if self.has_uid:
            non_tensors[keys.UID] = _object_array([r.uid for r in rows])
        if any(r.agent_name is not None for r in rows):
            non_tensors[AGENT_NAME] = _object_array([r.agent_name for r in rows])
        if self.has_reward_route:
            non_tensors[keys.REWARD_ROUTE] = _object_array([r.reward_route for r in rows])
        batch = TensorDict(tensors, batch_size=[len(rows)])
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info={})


def build_prompt_dataset(
    rows: Sequence[PromptRow],
    tokenizer: Any,
    *,
    max_prompt_length: int,
    truncation: str = "error",
    filter_overlong_prompts: bool = False,
    pad_to_max_length: bool = True,
    num_workers: int = 1,
    return_raw_chat: bool = True,
    tools: Sequence[dict] | None = None,
) -> PromptDataset:
    """Tokenise rows (in ``num_workers`` processes when > 1, `encode_prompts`), drop
    (``filter_overlong_prompts``) or truncate overlong ones.

    Raises:
        ValueError: an overlong prompt under ``truncation="error"`` (names the row, its length
            and the limit), an unknown truncation mode, or a tokenizer without a pad token.
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation={truncation!r} is not one of {list(TRUNCATION_MODES)}")
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    pad_token_id = getattr(tokenizer, "pad_token_id", None)
    if pad_token_id is None:
        raise ValueError(
            "the tokenizer has no pad token (pad_token_id is None); set tokenizer.pad_token "
            "(e.g. to its eos token) before building the dataset"
        )
    kept_rows, kept_ids = [], []
    encoded = encode_prompts(tokenizer, [row.prompt for row in rows], num_workers, tools)
    for row, ids in zip(rows, encoded):
        if filter_overlong_prompts and len(ids) > max_prompt_length:
            continue
        label = str(row.origin) if row.origin is not None else "prompt"
        kept_ids.append(truncate_prompt_ids(ids, max_prompt_length, truncation, label=label))
        kept_rows.append(row)
    num_filtered = len(rows) - len(kept_rows)
    if filter_overlong_prompts:
        logger.info(
            "filter_overlong_prompts: dropped %d of %d prompts longer than %d tokens",
            num_filtered,
            len(rows),
            max_prompt_length,
        )
    return PromptDataset(
        kept_rows,
        kept_ids,
        pad_token_id,
        max_prompt_length,
        pad_to_max_length,
        num_filtered,
        return_raw_chat,
    )


def load_prompt_dataset(
    paths: str | Path | Sequence[str | Path],
    tokenizer: Any,
    *,
    max_prompt_length: int,
    prompt_key: str = "prompt",
    truncation: str = "error",
    filter_overlong_prompts: bool = False,
    pad_to_max_length: bool = True,
    reward_fn_key: str = "data_source",
    max_samples: int = -1,
    shuffle: bool = False,
    seed: int | None = None,
    num_workers: int = 1,
    return_raw_chat: bool = True,
    tools: Sequence[dict] | None = None,
) -> PromptDataset:
    """`load_prompt_rows`, the ``max_samples`` cap (`max_samples_indices`, before the overlong
    filter as in verl), then `build_prompt_dataset`: one split, ready for the loader.

    Raises:
        ValueError: as `load_prompt_rows` and `build_prompt_dataset`, or when the overlong filter
            dropped every row (naming the files and the limit).
    """
    rows = load_prompt_rows(paths, prompt_key=prompt_key, reward_fn_key=reward_fn_key)
    kept = max_samples_indices(len(rows), max_samples, shuffle=shuffle, seed=seed)
    dataset = build_prompt_dataset(
        [rows[i] for i in kept],
        tokenizer,
        max_prompt_length=max_prompt_length,
        truncation=truncation,
        filter_overlong_prompts=filter_overlong_prompts,
        pad_to_max_length=pad_to_max_length,
        num_workers=num_workers,
        return_raw_chat=return_raw_chat,
        tools=tools,
    )
    if len(dataset) == 0:
        raise ValueError(
            f"every one of the {len(kept)} prompts of {as_path_list(paths)} is longer than "
            f"max_prompt_length={max_prompt_length} tokens and data.filter_overlong_prompts "
            "dropped them all; raise data.max_prompt_length or set data.truncation instead"
        )
    return dataset
