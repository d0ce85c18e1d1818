"""The datasets and the train loader of a run, from its ``data.*`` config (the one adapter).

``load_split(data, tokenizer, "train" | "val", reward=reward)`` reads ``data.train_files`` /
``data.val_files`` with every ``data.*`` key that shapes a split: prompt_key, reward_fn_key (the
routing column), train_max_samples / val_max_samples (with data.shuffle and data.seed choosing
the sample, as verl does for both splits), max_prompt_length, truncation,
filter_overlong_prompts and its filter_overlong_prompts_workers, return_raw_chat. Every row is
validated as it loads (``stages.data.dataset``: prompt, data_source, reward_model.ground_truth;
a file with no rows is an error naming it), and with the run's ``reward`` section every row's
route is checked against the scorer that will score it (``stages.data.routes``), so a bad row of
either split stops the run before step 1, naming its file and row. ``train_loader(data,
dataset)`` is the `StatefulPromptLoader` of data.train_batch_size, data.shuffle, data.seed and
data.dataloader_num_workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from stages.data.loader import StatefulPromptLoader
from stages.data.routes import check_routes
from stages.data.tokenize import PromptDataset, load_prompt_dataset
from stages.reward.settings import settings_from_sections

if TYPE_CHECKING:
    from stages.config.schema_data import DataConfig
    from stages.config.schema_reward import RewardConfig

Split = Literal["train", "val"]


def load_split(
    data: DataConfig,
    tokenizer: Any,
    split: Split,
    reward: RewardConfig | None = None,
    tools: list[dict] | None = None,
) -> PromptDataset:
    """The ``split`` dataset of the ``data`` config slice (module docstring).

    ``reward`` is the run's reward section: when its rule-based loop routes by the built-in
    registry (no custom reward function, not the reward model alone), every row's route must
    name a built-in scorer. A caller that only reads the data (no scoring) passes None.
    ``tools``: the tool schemas rendered into every prompt (``stages.agent.rollout.tool_schemas``
    of the run config: ``multi_turn.tool_config_path``'s tools); None: none.

    Raises:
        FileNotFoundError / IsADirectoryError / ValueError: a missing file, a directory given
            as a file, a file with no rows, a malformed row, or no row left after the overlong
            filter (each names the file, and the row).
        KeyError / NotImplementedError: a row whose route has no scorer (names file and row).
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    files, max_samples = (
        (data.train_files, data.train_max_samples)
        if split == "train"
        else (data.val_files, data.val_max_samples)
    )
    dataset = load_prompt_dataset(
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
        tools=tools,
    )
    if reward is not None and settings_from_sections(reward, data).routes_by_registry:
        check_routes(dataset.rows, data.reward_fn_key)
    return dataset


def train_loader(data: DataConfig, dataset: PromptDataset) -> StatefulPromptLoader:
    """The training loader: data.gen_batch_size prompts per batch (= data.train_batch_size
    without DAPO's dynamic sampling; with it, one batch per generation round, so the loader's
    position counts every prompt drawn), the last partial batch dropped (verl), shuffled by
    data.seed, collated in data.dataloader_num_workers processes."""
    return StatefulPromptLoader(
        dataset,
        data.gen_batch_size or data.train_batch_size,
        shuffle=data.shuffle,
        seed=data.seed,
        num_workers=data.dataloader_num_workers,
    )
