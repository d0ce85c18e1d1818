"""Shared fixtures: a char-level tokenizer and a builder of rollout-shaped batches."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dataproto import DataProto
from dataproto import keys as K

SCORERS_FILE = Path(__file__).with_name("scorers_for_tests.py")
PAD, EOS = "<pad>", "<eos>"


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable character; ``<pad>`` = 0, ``<eos>`` = 1."""
    vocab = {PAD: 0, EOS: 1}
    vocab.update({ch: i + 2 for i, ch in enumerate(string.printable)})
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS)


def make_batch(
    tokenizer: PreTrainedTokenizerFast,
    responses: list[str],
    *,
    prompts: list[str] | None = None,
    ground_truths: list[str] | None = None,
    data_source: str = "test/source",
    prompt_width: int = 6,
    response_width: int = 8,
    eos: bool = True,
) -> DataProto:
    """A rollout-shaped batch: prompts left-padded to P, responses (+ EOS) right-padded to R."""
    n = len(responses)
    prompts = prompts if prompts is not None else ["q" * (1 + i % 3) for i in range(n)]
    ground_truths = ground_truths if ground_truths is not None else [""] * n
    pad, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompt_ids = torch.full((n, prompt_width), pad)
    response_ids = torch.full((n, response_width), pad)
    mask = torch.zeros(n, prompt_width + response_width, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"][-prompt_width:]
        r = (
            tokenizer(response, add_special_tokens=False)["input_ids"] + ([eos_id] if eos else [])
        )[:response_width]
        prompt_ids[i, prompt_width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, prompt_width - len(p) : prompt_width] = 1
        if r:
            response_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, prompt_width : prompt_width + len(r)] = 1
    return DataProto.from_dict(
        {
            K.PROMPTS: prompt_ids,
            K.RESPONSES: response_ids,
            K.INPUT_IDS: torch.cat([prompt_ids, response_ids], dim=1),
            K.ATTENTION_MASK: mask,
        },
        {
            K.UID: np.array([f"u{i}" for i in range(n)], dtype=object),
            K.DATA_SOURCE: np.array([data_source] * n, dtype=object),
            K.REWARD_MODEL: np.array(
                [{"style": "rule", "ground_truth": gt} for gt in ground_truths], dtype=object
            ),
            K.EXTRA_INFO: np.array([{"index": i} for i in range(n)], dtype=object),
        },
    )


@pytest.fixture(scope="session")
def batch_factory(tokenizer):
    def build(responses: list[str], **kwargs) -> DataProto:
        return make_batch(tokenizer, responses, **kwargs)

    return build


@pytest.fixture(scope="session")
def script_loop(tokenizer):
    """A reward loop over ``scorers_for_tests.compute_score``: 2 workers, 0.5 s timeout, error score -1."""
    from stages.reward.custom import load_custom_scorer
    from stages.reward.loop import RewardLoop
    from stages.reward.settings import RewardSettings

    settings = RewardSettings(num_workers=2, timeout_s=0.5, error_score=-1.0)
    loop = RewardLoop(tokenizer, settings, scorer=load_custom_scorer(SCORERS_FILE))
    yield loop
    loop.close()
