"""The datasets and the train loader of a run, from its ``data.*`` config (the one adapter).

``load_split(data, tokenizer, "train" | "val")`` reads ``data.train_files`` / ``data.val_files``
with every ``data.*`` key that shapes a split: prompt_key, reward_fn_key (the routing column),
train_max_samples / val_max_samples (with data.shuffle and data.seed choosing the sample, as verl
does for both splits), max_prompt_length, truncation, filter_overlong_prompts and its
filter_overlong_prompts_workers, return_raw_chat. ``train_loader(data, dataset)`` is the
`StatefulPromptLoader` of data.train_batch_size, data.shuffle, data.seed and
data.dataloader_num_workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from stages.data.loader import StatefulPromptLoader
from stages.data.tokenize import PromptDataset, load_prompt_dataset

if TYPE_CHECKING:
    from stages.config.schema_data import DataConfig

Split = Literal["train", "val"]


def load_split(data: DataConfig, tokenizer: Any, split: Split) -> PromptDataset:
    """The ``split`` dataset of the ``data`` config slice (module docstring)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    files, max_samples = (
        (data.train_files, data.train_max_samples)
        if split == "train"
        else (data.val_files, data.val_max_samples)
    )
    return load_prompt_dataset(
        files,
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        prompt_key=data.prompt_key,
        truncation=data.truncation,
        filter_overlong_prompts=data.filter_overlong_prompts,
        reward_fn_key=data.reward_fn_key,
        max_samples=max_samples,
        shuffle=data.shuffle,
        seed=data.seed,
        num_workers=data.filter_overlong_prompts_workers,
        return_raw_chat=data.return_raw_chat,
    )


def train_loader(data: DataConfig, dataset: PromptDataset) -> StatefulPromptLoader:
    """The training loader: data.train_batch_size prompts per batch, the last partial batch
    dropped (verl), shuffled by data.seed, collated in data.dataloader_num_workers processes."""
    return StatefulPromptLoader(
        dataset,
        data.train_batch_size,
        shuffle=data.shuffle,
        seed=data.seed,
        num_workers=data.dataloader_num_workers,
    )
