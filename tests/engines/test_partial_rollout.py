"""A rollout in segments (flows/partial_rollout.py): each segment continues the rows still open
from the prompt ‖ the tokens so far; the stitched batch is the rollout layout with each token's
policy version; a checkpoint's segments come back; greedy segments on one set of weights are the
unsegmented generation."""

from __future__ import annotations

import pytest
import torch

from dataproto import DataProto
from dataproto import keys as K
from flows.partial_rollout import FinishingEngine, PartialRollout, segment_seed
from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker, call_settings
from stages.engines.rollout_hf import SamplingSettings

EOS, PAD = 2, 0


class Scripted:
    """An engine whose token at response column c of a row is 10 + c (log-prob −c / 10), but
    EOS at the columns ``eos[row]``; it records each call's rows (by their first prompt id),
    prompt tensors, seed and width."""

    def __init__(self, eos: dict[int, int]) -> None:
        self.eos, self.calls = eos, []

    def call(self, method: str, batch: DataProto, **kwargs) -> DataProto:
        ids = batch.batch[K.INPUT_IDS]
        width, prompt_width = kwargs["max_new_tokens"], 3
        self.calls.append({"batch": batch, **kwargs})
        done = ids.shape[1] - prompt_width
        columns = torch.arange(done, done + width)
        responses = (10 + columns).repeat(len(ids), 1)
        for i, row in enumerate(ids[:, 0].tolist()):
            if self.eos.get(row) in columns.tolist():
                responses[i, self.eos[row] - done] = EOS
        return DataProto.from_dict(
            {
                K.RESPONSES: responses,
                K.ROLLOUT_LOG_PROBS: -columns.float().repeat(len(ids), 1) / 10,
            }
        )


def prompts(rows: int = 3) -> DataProto:
    """Row i: prompt [i, 5, 6] left-padded by one column on row 0 ([PAD, 5, 6] there, so its
    first id is PAD = 0 too)."""
    ids = torch.tensor([[row, 5, 6] for row in range(rows)])
    mask = torch.ones_like(ids)
    ids[0, 0], mask[0, 0] = PAD, 0
    return DataProto.from_dict(
        {
            K.INPUT_IDS: ids,
            K.ATTENTION_MASK: mask,
            K.POSITION_IDS: (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


SETTINGS = SamplingSettings(response_length=6, eos_token_id=EOS, pad_token_id=PAD)


def segmented(ends=(2, 4), eos=None) -> tuple[PartialRollout, Scripted]:
    engine = Scripted(eos or {})
    partial = PartialRollout(prompts(), 7, ends, (EOS,), PAD)
    for index, version in enumerate((0, 2, 4)[: len(ends)]):
        partial.plan(version, f"theta{version}")
        partial.generate(engine, index)
    partial.plan(6, "theta6")
    return partial, engine


def test_each_segment_continues_the_open_rows_from_their_tokens_so_far() -> None:
    """Row 1 ends at column 1 (segment 0): segments 1 and 2 continue rows 0 and 2 only, from the
    prompt ‖ the 2, then 4 tokens so far, positions continuing the prompt's; each segment has
    its own seed."""
    partial, engine = segmented(eos={1: 1})
    out = partial.finish(engine, SETTINGS)
    assert [call["max_new_tokens"] for call in engine.calls] == [2, 2, 2]
    assert [call["seed"] for call in engine.calls] == [segment_seed(7, i) for i in range(3)]
    assert segment_seed(7, 0) == 7
    second = engine.calls[1]["batch"].batch
    assert second[K.INPUT_IDS].tolist() == [[PAD, 5, 6, 10, 11], [2, 5, 6, 10, 11]]
    assert second[K.ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert second[K.POSITION_IDS].tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert out.batch[K.RESPONSES].tolist() == [
        [10, 11, 12, 13, 14, 15],
        [10, EOS, PAD, PAD, PAD, PAD],
        [10, 11, 12, 13, 14, 15],
    ]
    assert out.batch[K.RESPONSE_MASK].tolist()[1] == [1, 1, 0, 0, 0, 0]
    torch.testing.assert_close(
        out.batch[K.ROLLOUT_LOG_PROBS][0], -torch.arange(6, dtype=torch.float32) / 10
    )
    torch.testing.assert_close(
        out.batch[K.ROLLOUT_LOG_PROBS][1], torch.tensor([0.0, -0.1, 0, 0, 0, 0])
    )
    assert out.batch[K.ROLLOUT_POLICY_VERSIONS].tolist() == [[0, 0, 2, 2, 6, 6]] * 3


def test_a_row_that_ends_on_a_cut_is_not_continued() -> None:
    partial, engine = segmented(ends=(2,), eos={1: 1, 2: 0})
    partial.finish(engine, SETTINGS)
    assert engine.calls[1]["batch"].batch[K.INPUT_IDS][:, 0].tolist() == [PAD]


def test_finish_leaves_the_segments_done_as_they_were() -> None:
    """The stage may retry the last segment: a second finish gives the same batch."""
    partial, engine = segmented()
    first, second = partial.finish(engine, SETTINGS), partial.finish(engine, SETTINGS)
    for key in first.batch.keys():  # noqa: SIM118
        assert torch.equal(first.batch[key], second.batch[key]), key


def test_a_checkpoints_segments_come_back() -> None:
    partial, engine = segmented(ends=(2, 4))
    columns, segments = partial.state()
    again = PartialRollout(prompts(), 7, (2, 4), (EOS,), PAD)
    assert len(segments) == 2  # the last one's columns are not done
    again.restore(columns, segments)
    assert again.done == 4 and again.segments == partial.segments[:2]
    again.plan(6, "theta6")
    first, second = partial.finish(engine, SETTINGS), again.finish(engine, SETTINGS)
    for key in first.batch.keys():  # noqa: SIM118
        assert torch.equal(first.batch[key], second.batch[key]), key
    with pytest.raises(ValueError, match="holds 4 columns after 1 segments"):
        PartialRollout(prompts(), 7, (2, 4), (EOS,), PAD).restore(columns, segments[:1])


def test_the_weights_key_names_every_segments_start_and_weights() -> None:
    keys = set()
    for ends, last in (((2, 4), "theta6"), ((2, 4), "theta7"), ((2, 3), "theta6")):
        partial = PartialRollout(prompts(), 7, ends, (EOS,), PAD)
        for version in (0, 2, 4):
            partial.plan(version, f"theta{version}")
        partial.segments[-1] = type(partial.segments[-1])(ends[-1], 4, last)
        keys.add(partial.weights_key())
    assert len(keys) == 3


def test_the_finishing_engine_runs_only_the_rollout_it_was_seeded_for() -> None:
    partial, engine = segmented()
    engine.config = engine.tokenizer = None
    finishing = FinishingEngine(partial, engine)
    with pytest.raises(ValueError, match="runs only"):
        finishing.call("compute_log_prob", prompts(), seed=7)
    with pytest.raises(ValueError, match="seeded 7 for training"):
        finishing.call("generate_sequences", prompts(), seed=8)


@pytest.fixture(scope="module")
def greedy_actor(tmp_path_factory, actor_config):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("model"))
    config = actor_config(model_dir, "actor_rollout_ref.rollout.do_sample=false")
    return ActorWorker(config, total_training_steps=1)


class Actor:
    """An actor worker called as an engine (``call(method, batch, **kwargs)``)."""

    def __init__(self, worker: ActorWorker) -> None:
        self.worker, self.config, self.tokenizer = worker, worker.config, worker.tokenizer

    def call(self, method: str, batch: DataProto, **kwargs) -> DataProto:
        return getattr(self.worker, method)(batch, **kwargs)


def test_greedy_segments_on_one_set_of_weights_are_one_generation(
    greedy_actor, encode_prompts
) -> None:
    """HF generate continued from its own tokens at columns 2 and 4 decodes what one generation
    of all 6 columns decodes: the continuation's prompt, mask and positions are right."""
    engine = Actor(greedy_actor)
    batch = encode_prompts(greedy_actor.tokenizer, ["abc", "hello there", "x"], 2)
    settings = call_settings(greedy_actor.config, greedy_actor.tokenizer, len(batch))
    want = greedy_actor.generate_sequences(batch, seed=3)
    partial = PartialRollout(batch, 3, (2, 4), settings.stop_ids, settings.pad_token_id)
    for index in range(2):
        partial.plan(0, "theta0")
        partial.generate(engine, index)
    partial.plan(0, "theta0")
    got = FinishingEngine(partial, engine).call("generate_sequences", batch, seed=3)
    for key in (K.RESPONSES, K.RESPONSE_MASK, K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS):
        assert torch.equal(got.batch[key], want.batch[key]), key
    torch.testing.assert_close(
        got.batch[K.ROLLOUT_LOG_PROBS], want.batch[K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=1e-5
    )
    assert (got.batch[K.ROLLOUT_POLICY_VERSIONS] == 0).all()
