"""Data: verl-layout prompt datasets, tokenisation, a resumable loader, the tiny model, the demo task.

- `load_prompt_rows` (alias `load_dataset_files`) / `write_prompt_rows`: parquet and JSON Lines
  files in verl's layout.
- `load_prompt_dataset` / `build_prompt_dataset` → `PromptDataset`: chat template (or the plain
  template), truncation, overlong filtering; ``collate`` gives the left-padded prompt DataProto.
  `load_split` builds one split from the ``data.*`` config.
- `StatefulPromptLoader`: seeded per-epoch shuffling, JSON state, exact resume (epoch boundary
  included), optional worker processes (`collate_batches`).
- `build_tiny_tokenizer`, `make_tiny_model`, `load_tokenizer`, `load_causal_lm`.
- The demo task ``ppoflow/demo-copy``: `make_demo_data`, `demo_compute_score`.

Names are imported on first use (PEP 562), so a data-loader worker process that unpickles a
`PromptDataset` does not pay for transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PromptRow": ("stages.data.dataset", "PromptRow"),
    "RowOrigin": ("stages.data.dataset", "RowOrigin"),
    "load_prompt_rows": ("stages.data.dataset", "load_prompt_rows"),
    "load_dataset_files": ("stages.data.dataset", "load_prompt_rows"),
    "max_samples_indices": ("stages.data.dataset", "max_samples_indices"),
    "write_prompt_rows": ("stages.data.dataset", "write_prompt_rows"),
    "DEMO_DATA_SOURCE": ("stages.data.demo_task", "DATA_SOURCE"),
    "demo_compute_score": ("stages.data.demo_task", "compute_score"),
    "make_demo_data": ("stages.data.demo_task", "make_demo_data"),
    "make_demo_rows": ("stages.data.demo_task", "make_demo_rows"),
    "load_split": ("stages.data.from_config", "load_split"),
    "StatefulPromptLoader": ("stages.data.loader", "StatefulPromptLoader"),
    "collate_batches": ("stages.data.workers", "collate_batches"),
    "load_causal_lm": ("stages.data.tiny_model", "load_causal_lm"),
    "make_tiny_model": ("stages.data.tiny_model", "make_tiny_model"),
    "tiny_model_config": ("stages.data.tiny_model", "tiny_model_config"),
    "TRUNCATION_MODES": ("stages.data.tokenize", "TRUNCATION_MODES"),
    "PromptDataset": ("stages.data.tokenize", "PromptDataset"),
    "build_prompt_dataset": ("stages.data.tokenize", "build_prompt_dataset"),
    "encode_prompt": ("stages.data.tokenize", "encode_prompt"),
    "encode_prompts": ("stages.data.tokenize", "encode_prompts"),
    "left_pad": ("stages.data.tokenize", "left_pad"),
    "load_prompt_dataset": ("stages.data.tokenize", "load_prompt_dataset"),
    "plain_template": ("stages.data.tokenize", "plain_template"),
    "render_prompt": ("stages.data.tokenize", "render_prompt"),
    "truncate_prompt_ids": ("stages.data.tokenize", "truncate_prompt_ids"),
    "build_tiny_tokenizer": ("stages.data.tokenizer", "build_tiny_tokenizer"),
    "load_tokenizer": ("stages.data.tokenizer", "load_tokenizer"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stages.data' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(module), attribute)
