"""trainer.rollout_data_dir / validation_data_dir: verl's ``{step}.jsonl`` dumps, and the
validation pass that feeds them (data.validation_shuffle, data.dataloader_num_workers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dataproto import DataProto
from dataproto import keys as K
from dataproto.equality import dataproto_equal
from flows.sinks.generations_dump import (
    dump_rollout,
    dump_validation,
    generation_records,
    rollout_records,
    write_jsonl,
)
from flows.validate import validate
from stages.config import load_config
from stages.data.dataset import PromptRow
from stages.data.tokenize import build_prompt_dataset
from stages.data.tokenizer import build_tiny_tokenizer
from stages.reward.loop import LoopResult
from stages.reward.stage import LOOP_ENGINE


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _read(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def _rollout_batch(tokenizer) -> DataProto:
    """2 rows: prompt "ab" → response "c" + EOS, prompt "d" → response "ef" (no EOS)."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = torch.tensor([enc("ab"), [pad, *enc("d")]])  # (2, 2), left-padded
    responses = torch.tensor([[*enc("c"), eos, pad], [*enc("ef"), pad]])  # (2, 3)
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    prompt_mask = (prompts != pad).long()
    scores = torch.zeros(2, 3)
    scores[0, 1], scores[1, 1] = 1.0, 0.25
    return DataProto.from_dict(
        {
            K.PROMPTS: prompts,
            K.RESPONSES: responses,
            K.RESPONSE_MASK: response_mask,
            K.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
            K.TOKEN_LEVEL_SCORES: scores,
        },
        {
            K.REWARD_MODEL: np.array([{"ground_truth": "c"}, {"ground_truth": "x"}], dtype=object),
            "acc": np.array([True, False], dtype=object),
            "pred": np.array([np.str_("c"), np.float32(0.5)], dtype=object),
        },
        {K.REWARD_EXTRA_KEYS: ["acc", "pred"]},
    )


def test_generation_records_follow_verls_fields():
    records = generation_records(
        {"input": ["p"], "output": ["o"], "gts": [None], "score": [0.5]},
        {"score": [1.0], "short": []},
        step=4,
    )
    assert records == [{"input": "p", "output": "o", "gts": None, "score": 1.0, "step": 4}]


def test_rollout_dump_writes_one_jsonl_per_step(tmp_path, tokenizer):
    batch = _rollout_batch(tokenizer)
    target = tmp_path / "rollouts"
    dump_rollout(str(target), batch, tokenizer, step=3)
    dump_rollout(None, batch, tokenizer, step=4)  # off
    assert sorted(p.name for p in target.iterdir()) == ["3.jsonl"]
    assert _read(target / "3.jsonl") == [
        {"input": "ab", "output": "c", "gts": "c", "score": 1.0, "step": 3, "acc": True,
         "pred": "c"},
        {"input": "d", "output": "ef", "gts": "x", "score": 0.25, "step": 3, "acc": False,
         "pred": 0.5},
    ]  # fmt: skip
    assert rollout_records(batch, tokenizer, 3)[1]["score"] == 0.25


def test_write_jsonl_replaces_a_steps_file(tmp_path):
    write_jsonl(str(tmp_path), 1, [{"a": 1}, {"a": 2}])
    path = write_jsonl(str(tmp_path), 1, [{"a": 3}])
    assert path.endswith("/1.jsonl") and _read(path) == [{"a": 3}]


# --- the validation pass ------------------------------------------------------------------------


class EchoActor:
    """generate_sequences: each prompt's last content token (before the chat template's
    ``<|assistant|>``), then EOS (R = 2)."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    def call(self, method: str, batch: DataProto, validate: bool) -> DataProto:
        assert method == "generate_sequences" and validate
        prompts, mask = batch.batch[K.INPUT_IDS], batch.batch[K.ATTENTION_MASK]
        responses = torch.stack([prompts[:, -2], torch.full_like(prompts[:, -2], self.eos)], 1)
        response_mask = torch.ones_like(responses)
        return DataProto.from_dict(
            {
                K.PROMPTS: prompts,
                K.RESPONSES: responses,
                K.RESPONSE_MASK: response_mask,
                K.INPUT_IDS: torch.cat([prompts, responses], 1),
                K.ATTENTION_MASK: torch.cat([mask, response_mask], 1),
            }
        )


class IndexScorer:
    """The reward loop's interface: row i scores its prompt's extra_info index; extra ``acc``."""

    def score(self, batch: DataProto) -> LoopResult:
        index = np.array([info["index"] for info in batch.non_tensor_batch[K.EXTRA_INFO]])
        acc = np.array([bool(i % 2) for i in index], dtype=object)
        return LoopResult(index.astype(np.float32), {"acc": acc}, [], {})


@pytest.fixture(scope="module")
def val_set(tokenizer):
    rows = [
        PromptRow(
            prompt=[{"role": "user", "content": f"q{i}"}],
            data_source="test/source",
            reward_model={"ground_truth": str(i)},
            extra_info={"index": i},
        )
        for i in range(6)
    ]
    return build_prompt_dataset(rows, tokenizer, max_prompt_length=8)


def _validate(val_set, tokenizer, *overrides: str, step: int = 5):
    cfg = load_config(None, list(overrides))
    engines = {"actor": EchoActor(tokenizer.eos_token_id), LOOP_ENGINE: IndexScorer()}
    return validate(cfg, engines, val_set, tokenizer, step)


def _order(result) -> list[int]:
    return [i for batch, _ in result.scored for i in batch.non_tensor_batch[K.INDEX]]


def test_validation_shuffle_reorders_rows_reproducibly(val_set, tokenizer):
    plain = _validate(val_set, tokenizer, "data.val_batch_size=4")
    assert _order(plain) == [0, 1, 2, 3, 4, 5]
    shuffled = _validate(
        val_set, tokenizer, "data.val_batch_size=4", "data.validation_shuffle=true"
    )
    again = _validate(val_set, tokenizer, "data.val_batch_size=4", "data.validation_shuffle=true")
    assert sorted(_order(shuffled)) == list(range(6)) and _order(shuffled) != _order(plain)
    assert _order(shuffled) == _order(again)
    assert shuffled.metrics == pytest.approx(plain.metrics)  # the same rows, scored the same


def test_validation_workers_give_the_same_batches(val_set, tokenizer):
    main = _validate(val_set, tokenizer, "data.val_batch_size=2", "data.dataloader_num_workers=0")
    workers = _validate(
        val_set, tokenizer, "data.val_batch_size=2", "data.dataloader_num_workers=2"
    )
    assert len(main.scored) == len(workers.scored) == 3
    for (a, _), (b, _) in zip(main.scored, workers.scored):
        a.non_tensor_batch.pop(K.UID), b.non_tensor_batch.pop(K.UID)  # fresh uuid4s
        assert dataproto_equal(a, b)


def test_validation_dump_holds_every_row_with_reward(tmp_path, val_set, tokenizer):
    result = _validate(val_set, tokenizer, "data.val_batch_size=4")
    dump_validation(str(tmp_path), result.scored, tokenizer, step=5)
    records = _read(tmp_path / "5.jsonl")
    assert [r["gts"] for r in records] == [str(i) for i in range(6)]
    assert [r["score"] for r in records] == [float(i) for i in range(6)]
    assert [r["reward"] for r in records] == [float(i) for i in range(6)]
    assert [r["acc"] for r in records] == [bool(i % 2) for i in range(6)]
    assert records[2]["input"] == "q2" and records[2]["output"] == "2" and records[2]["step"] == 5
