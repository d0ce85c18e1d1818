"""``data.*``: where the prompts come from and how they are batched (verl's ``data`` keys)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from stages.config._base import ConfigModel


class DataConfig(ConfigModel):
    """Datasets (parquet/jsonl in verl's layout), prompt lengths and the training batch size."""

    train_files: list[str] = Field(
        ["~/data/rlhf/gsm8k/train.parquet"],
        min_length=1,
        description="Training data files; a single string is read as a one-item list (paths, relative to the working directory)",
    )
    val_files: list[str] = Field(
        ["~/data/rlhf/gsm8k/test.parquet"],
        min_length=1,
        description="Validation data files; a single string is read as a one-item list (paths)",
    )
    train_max_samples: int = Field(
        -1,
        ge=-1,
        description="Use at most this many training rows: the first ones, or a data.seed sample with data.shuffle; -1 or null = all (rows)",
    )
    val_max_samples: int = Field(
        -1,
        ge=-1,
        description="Use at most this many validation rows, chosen as for train_max_samples; -1 or null = all (rows)",
    )
    prompt_key: str = Field("prompt", description="Column holding the chat messages (column name)")
    reward_fn_key: str = Field(
        "data_source",
        description="Column whose value routes a row to its scorer (passed as its data_source argument) (column name)",
    )
    max_prompt_length: int = Field(
        512, ge=1, description="Longest prompt; prompts are left-padded to it (tokens)"
    )
    max_response_length: int = Field(
        512,
        ge=1,
        description="Longest generated response; responses are right-padded to it (tokens)",
    )
    train_batch_size: int = Field(
        1024, ge=1, description="Prompts per training step, before rollout.n repeats (prompts)"
    )
    gen_batch_size: int | None = Field(
        None,
        ge=1,
        description="Prompts per generation round with algorithm.filter_groups.enable (DAPO's dynamic sampling; the loader hands out batches of this size and the epoch length counts them); ≥ train_batch_size; null = train_batch_size (prompts)",
    )
    val_batch_size: int | None = Field(
        None,
        ge=1,
        description="Prompts per validation batch; null = the whole validation set (prompts)",
    )
    return_raw_chat: bool = Field(
        True,
        description="Keep the untokenized chat messages in the batch as non-tensor raw_prompt (bool)",
    )
    shuffle: bool = Field(True, description="Shuffle the training set every epoch (bool)")
    seed: int | None = Field(
        None,
        description="Seed of the training sampler's generator; null = trainer.seed [ppoflow: verl leaves the sampler unseeded] (seed)",
    )
    validation_shuffle: bool = Field(
        False,
        description="Shuffle the validation set, a new order each validation seeded by data.seed and the step [ppoflow: verl's is unseeded] (bool)",
    )
    dataloader_num_workers: int = Field(
        8,
        ge=0,
        description="Processes that collate the prompt batches (train loader and a multi-batch validation), same batches as 0; 0 = load in the main process (processes)",
    )
    filter_overlong_prompts: bool = Field(
        False, description="Drop rows whose prompt exceeds max_prompt_length at load time (bool)"
    )
    filter_overlong_prompts_workers: int = Field(
        1,
        ge=1,
        description="Processes that tokenize the prompts at load time, which is also the overlong filter's measurement; 1 = this process (processes)",
    )
    truncation: Literal["error", "left", "right", "middle"] = Field(
        "error",
        description="What to do with a prompt longer than max_prompt_length: raise, or cut tokens on the left/right/middle (choice)",
    )

    @field_validator("train_max_samples", "val_max_samples", mode="before")
    @classmethod
    def _all_rows(cls, value: object) -> object:
        """``null`` means all rows (-1), as verl's ``.get(key, -1)``; 0 would mean no rows at all."""
        if value is None:
            return -1
        if value == 0:
            raise ValueError(
                "0 rows leaves nothing to train on; use -1 (or null) for all rows or a positive count"
            )
        return value

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: object) -> object:
        """Accept ``train_files: a.parquet`` as verl does: a single path becomes a 1-item list."""
        return [value] if isinstance(value, str) else value
