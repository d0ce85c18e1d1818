"""Data: verl-layout prompt datasets, tokenisation, a resumable loader, the tiny model, the demo task.

- `load_prompt_rows` (alias `load_dataset_files`) / `write_prompt_rows`: parquet and JSON Lines
  files in verl's layout.
- `load_prompt_dataset` / `build_prompt_dataset` → `PromptDataset`: chat template (or the plain
  template), truncation, overlong filtering; ``collate`` gives the left-padded prompt DataProto.
- `StatefulPromptLoader`: seeded per-epoch shuffling, JSON state, exact resume (epoch boundary
  included).
- `build_tiny_tokenizer`, `make_tiny_model`, `load_tokenizer`, `load_causal_lm`.
- The demo task ``ppoflow/demo-copy``: `make_demo_data`, `demo_compute_score`.
"""

from stages.data.dataset import PromptRow, RowOrigin, load_prompt_rows, write_prompt_rows
from stages.data.dataset import load_prompt_rows as load_dataset_files
from stages.data.demo_task import DATA_SOURCE as DEMO_DATA_SOURCE
from stages.data.demo_task import compute_score as demo_compute_score
from stages.data.demo_task import make_demo_data, make_demo_rows
from stages.data.loader import StatefulPromptLoader
from stages.data.tiny_model import load_causal_lm, make_tiny_model, tiny_model_config
from stages.data.tokenize import (
    TRUNCATION_MODES,
    PromptDataset,
    build_prompt_dataset,
    encode_prompt,
    left_pad,
    load_prompt_dataset,
    plain_template,
    render_prompt,
    truncate_prompt_ids,
)
from stages.data.tokenizer import build_tiny_tokenizer, load_tokenizer

__all__ = [
    "DEMO_DATA_SOURCE",
    "TRUNCATION_MODES",
    "PromptDataset",
    "PromptRow",
    "RowOrigin",
    "StatefulPromptLoader",
    "build_prompt_dataset",
    "build_tiny_tokenizer",
    "demo_compute_score",
    "encode_prompt",
    "left_pad",
    "load_causal_lm",
    "load_dataset_files",
    "load_prompt_dataset",
    "load_prompt_rows",
    "load_tokenizer",
    "make_demo_data",
    "make_demo_rows",
    "make_tiny_model",
    "plain_template",
    "render_prompt",
    "tiny_model_config",
    "truncate_prompt_ids",
    "write_prompt_rows",
]
