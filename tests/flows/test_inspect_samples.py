"""`ppoflow inspect RUN --step K --samples N [--sort] [--where] [--json]`: each response joined
with its own score, extras and advantage although balance reordered the rows.

Fast tests read a hand-made run directory (``build_run``; the tiny byte-level tokenizer, so a
response's text is its bytes), 4 rows in generation order with these known values:

    row  uid  data_source  response  score  acc  advantage (its response_mask tokens)
    0    u0   src-a        "aa"      0.1    0.0  -1.5
    1    u0   src-a        "bbb"     0.2    1.0  -0.5
    2    u1   src-b        "c"       0.3    1.0   0.5
    3    u1   src-b        "dddd"    0.4    0.0   1.5

balance's permutation is [2, 0, 3, 1] (batch row j = generation row PERM[j]), so the reward and
advantage artifacts hold row 2's values first: a join by position would give "aa" 0.3. Each
advantage row holds 99.0 outside its response_mask. Step 1 is single-turn, with the extras in
the reward artifact; step 2 is an agent rollout (row 0 has an assistant turn with a call, a tool
turn and a final assistant turn; the others one turn) that scored inside the rollout, so its
extras are in the rollout artifact; step 3's advantage stage was skipped.

The slow tests train 2 tiny steps once per module (a single-turn run and an agent run) and check
every sample's score against the scorer run again on its own decoded response.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dataproto import DataProto
from dataproto import keys as K
from dataproto.artifact import ArtifactRef, load_artifact, save_artifact
from flows.cli.app import app
from flows.runs import report as run_report
from flows.runs.store import RunStore, StageRecord, StepJournal

REPO = Path(__file__).resolve().parents[2]
RESPONSES = ["aa", "bbb", "c", "dddd"]
SCORES = [0.1, 0.2, 0.3, 0.4]
ACC = [0.0, 1.0, 1.0, 0.0]
ADVANTAGES = [-1.5, -0.5, 0.5, 1.5]
UIDS = ["u0", "u0", "u1", "u1"]
SOURCES = ["src-a", "src-a", "src-b", "src-b"]
PERM = [2, 0, 3, 1]
P, R = 4, 96
# row 0 of step 2, the agent step: (role, text, mask)
CALL_TEXT = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
TURNS = [("assistant", CALL_TEXT, 1), ("tool", "alpha", 0), ("assistant", "a is alpha", 1)]
CALL = {"name": "lookup", "arguments": '{"key": "a"}'}
RESULT = {"name": "lookup", "status": "ok", "reward": 0.5, "seconds": 0.01, "text": "alpha"}


def inspect(*args: object):
    return CliRunner().invoke(app, ["inspect", *map(str, args)])


def samples_json(*args: object) -> dict:
    result = inspect(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# --- the hand-made run -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from stages.data.tokenizer import build_tiny_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer().save_pretrained(directory)
    return directory


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _right_padded(rows: list[list[int]], width: int, fill: int = 0) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _balanced(values: list) -> list:
    """Generation-order values in the balanced order of the later stages' artifacts."""
    return [values[j] for j in PERM]


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _step_input(tokenizer) -> DataProto:
    prompts = [_ids(tokenizer, f"q{i}") for i in range(4)]  # 2 ids each, left-padded to P
    ids = torch.tensor([[tokenizer.pad_token_id] * (P - len(p)) + p for p in prompts])
    mask = (torch.arange(P) >= P - 2).long().expand(4, P).clone()
    return DataProto.from_dict(
        {
            K.PROMPT_INPUT_IDS: ids,
            K.PROMPT_ATTENTION_MASK: mask,
            K.PROMPT_POSITION_IDS: mask.cumsum(-1),
        },
        {K.UID: _objects(UIDS), K.DATA_SOURCE: _objects(SOURCES)},
    )


def _agent_row(tokenizer) -> tuple[list[int], list[int], list[dict]]:
    """Row 0 of the agent step: its ids, its response mask and its turn records."""
    ids, mask, turns = [], [], []
    for role, text, is_model in TURNS:
        span = _ids(tokenizer, text)
        turns.append(
            {
                "role": role,
                "start": len(ids),
                "end": len(ids) + len(span),
                "seconds": 0.25,
                "calls": [CALL] if text == CALL_TEXT else [],
                "malformed": 0,
                "results": [RESULT] if role == "tool" else [],
            }
        )
        ids += span
        mask += [is_model] * len(span)
    return ids, mask, turns


def _rollout(tokenizer, agent: bool) -> DataProto:
    """The rollout delta in generation order (agent: row 0 multi-turn, extras scored inside)."""
    rows = [_ids(tokenizer, text) for text in RESPONSES]
    masks = [[1] * len(row) for row in rows]
    non_tensors = {}
    if agent:
        rows[0], masks[0], turns = _agent_row(tokenizer)
        others = [[_single_turn(row)] for row in rows[1:]]
        non_tensors = {
            "agent_turns": _objects([turns, *others]),
            "agent_stop_reason": _objects(["no_tool_call"] * 4),
            "acc": _objects(ACC),
        }
    responses = _right_padded(rows, R, tokenizer.pad_token_id)
    response_mask = _right_padded(masks, R)
    tensors = {K.RESPONSES: responses, K.RESPONSE_MASK: response_mask}
    if agent:  # tool ids are attended to: the attention mask is stored, not derived
        is_response = _right_padded([[1] * len(row) for row in rows], R)
        tensors[K.ATTENTION_MASK] = torch.cat(
            [_step_input(tokenizer).batch[K.PROMPT_ATTENTION_MASK], is_response], 1
        )
    return DataProto.from_dict(
        tensors, non_tensors, {K.REWARD_EXTRA_KEYS: ["acc"]} if agent else {}
    )


def _single_turn(row: list[int]) -> dict:
    return {"role": "assistant", "start": 0, "end": len(row), "seconds": 0.25, "calls": [],
            "malformed": 0, "results": []}  # fmt: skip


def _reward(agent: bool) -> DataProto:
    """The reward delta in the balanced order; single-turn: the extras too."""
    scores = torch.tensor(_balanced(SCORES))
    rm_scores = torch.zeros(4, R)
    rm_scores[:, 0] = scores
    extras = (
        {} if agent else {"acc": _objects(_balanced(ACC)), "pred": _objects(_balanced(RESPONSES))}
    )
    meta = {K.REWARD_EXTRA_KEYS: ["acc"] if agent else ["acc", "pred"]}
    return DataProto.from_dict({K.RM_SCORES: rm_scores, K.SEQ_SCORES: scores}, extras, meta)


def _advantage(rollout: DataProto) -> DataProto:
    """advantages in the balanced order: the row's value on its response_mask, 99 elsewhere."""
    mask = rollout.batch[K.RESPONSE_MASK][torch.tensor(PERM)].bool()
    values = torch.tensor(_balanced(ADVANTAGES))[:, None].expand(4, R)
    advantages = torch.where(mask, values, torch.full((4, R), 99.0))
    return DataProto.from_dict({K.ADVANTAGES: advantages, K.RETURNS: advantages.clone()})


def _record(stage: str, ref: ArtifactRef) -> StageRecord:
    return StageRecord(stage, "ran", "cache miss", ref.path, ref.fingerprint, f"key-{stage}",
                       ref.rows, ref.nbytes, 0.1)  # fmt: skip


def _write_step(store: RunStore, tokenizer, step: int, agent: bool, skip_advantage: bool) -> None:
    input_ref = store.save_input(step, _step_input(tokenizer))
    rollout = _rollout(tokenizer, agent)
    deltas = {
        "rollout": rollout,
        "balance": DataProto.from_dict({K.BALANCE_ORDER: torch.tensor(PERM)}),
        "reward": _reward(agent),
        "advantage": _advantage(rollout),
    }
    records = []
    for stage, delta in deltas.items():
        if stage == "advantage" and skip_advantage:
            records.append(StageRecord(stage, "skipped", "disabled: for this test"))
            continue
        records.append(
            _record(stage, save_artifact(delta, store.artifact_path(step, stage), stage=stage))
        )
        if stage == "reward":
            records.append(
                StageRecord("values", "skipped", "disabled: uses_critic(config) is False")
            )
    store.write_journal(StepJournal(step, "done", input_ref.path, input_ref.fingerprint, records))


def build_run(root: Path, tokenizer_dir: Path | str) -> RunStore:
    """The run of the module docstring; its config names ``tokenizer_dir``."""
    from stages.data.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    store = RunStore(root)
    model = {"path": str(tokenizer_dir), "tokenizer_path": str(tokenizer_dir)}
    store.save_config({"actor_rollout_ref": {"model": model}, "trainer": {"experiment_name": "x"}})
    for step, agent, skip in ((1, False, False), (2, True, False), (3, False, True)):
        _write_step(store, tokenizer, step, agent, skip)
    return store


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer_dir) -> RunStore:
    return build_run(tmp_path_factory.mktemp("hand") / "run", tokenizer_dir)


# --- the join ----------------------------------------------------------------------------------


def test_each_response_gets_its_own_score_extras_and_advantage(run):
    reward = load_artifact(run.artifact_path(1, "reward"))
    naive = reward.batch[K.SEQ_SCORES].tolist()
    assert naive[0] == pytest.approx(SCORES[2])  # a join by position would pair "aa" with 0.3
    document = samples_json(run.root, "--step", 1, "--samples", 4)
    assert document["rows"] == 4 and document["reordered_by"] == ["balance"]
    assert document["score"] == "reward.seq_scores" and "response_mask" in document["advantage"]
    for row, sample in enumerate(document["samples"]):
        assert sample["row"] == row and sample["batch_row"] == PERM.index(row)
        assert sample["response"] == RESPONSES[row]
        assert sample["prompt"] == f"q{row}"
        assert sample["score"] == pytest.approx(SCORES[row])
        assert sample["extras"] == {"acc": ACC[row], "pred": RESPONSES[row]}
        assert sample["advantage"] == pytest.approx(
            ADVANTAGES[row]
        )  # 99s outside the mask left out
        assert (sample["uid"], sample["data_source"]) == (UIDS[row], SOURCES[row])
        assert sample["turns"] is None


def _blocks(text: str) -> dict[int, str]:
    """Each sample's block of the text output, by its row."""
    blocks = {}
    for block in text.split("\nsample ")[1:]:
        row = int(block.split("  row ")[1].split()[0])
        blocks[row] = block
    return blocks


def test_the_text_prints_each_response_with_its_own_score(run):
    result = inspect(run.root, "--step", 1, "--samples", 4)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"step 1 of {run.root}: 4 samples; showing 4 in row order"
    assert "batch row = the order after balance (reward, advantage)" in lines[1]
    blocks = _blocks(result.stdout)
    assert sorted(blocks) == [0, 1, 2, 3]
    for row, block in blocks.items():
        fields = dict(line.split(None, 1) for line in block.splitlines()[1:6])
        assert fields["score"] == f"{SCORES[row]:.6g}"
        assert fields["advantage"] == f"{ADVANTAGES[row]:.6g}"
        assert fields["extras"] == f"acc={ACC[row]}  pred={RESPONSES[row]!r}"
        assert fields["uid"] == UIDS[row]
        response = block.split(f"  response ({len(RESPONSES[row])} tokens)\n")[1]
        assert response.splitlines()[0] == f"    {RESPONSES[row]}"


@pytest.mark.parametrize(
    ("options", "rows"),
    [
        (["--sort", "score"], [3, 2, 1, 0]),
        (["--sort", "advantage", "--samples", 2], [3, 2]),
        (["--where", "acc=1.0"], [1, 2]),
        (["--where", "data_source=src-b", "--sort", "score"], [3, 2]),
        (["--where", "uid=u0", "--where", "acc=0.0"], [0]),
        (["--where", "pred=c", "--samples", 1], [2]),
    ],
)
def test_sort_where_and_samples_choose_the_rows(run, options, rows):
    options = ["--samples", 4, *options] if "--samples" not in options else options
    document = samples_json(run.root, "--step", 1, *options)
    assert [sample["row"] for sample in document["samples"]] == rows
    for sample in document["samples"]:  # still each its own
        assert sample["score"] == pytest.approx(SCORES[sample["row"]])


def test_a_where_that_matches_nothing_lists_the_values(run):
    result = inspect(run.root, "--step", 1, "--samples", 2, "--where", "acc=1")
    assert result.exit_code == 0, result.output
    assert "4 samples, 0 where acc=1; showing 0" in result.stdout
    assert "acc values: 0.0, 1.0" in result.stdout
    assert "\nsample " not in result.stdout


# --- agent turns -------------------------------------------------------------------------------


def test_a_multi_turn_sample_prints_its_turns(run):
    result = inspect(run.root, "--step", 2, "--samples", 1)
    assert result.exit_code == 0, result.output
    block = _blocks(result.stdout)[0]
    assert "  extras       acc=0.0" in block  # from the rollout artifact: it scored the rows
    (call, tool, answer) = (len(text) for _, text, _ in TURNS)  # one id per byte
    header = f"  response ({call + tool + answer} tokens, 3 turns, stop no_tool_call)\n"
    assert block.split(header)[1].splitlines() == [
        f"    turn 1  assistant  {call} tokens  mask model  0.250 s",
        f"      {CALL_TEXT}",
        '      call lookup {"key": "a"}',
        f"    turn 2  tool  {tool} tokens  mask tool  0.250 s",
        "      alpha",
        '      result lookup: ok, reward 0.5, 0.010 s, text "alpha"',
        f"    turn 3  assistant  {answer} tokens  mask model  0.250 s",
        "      a is alpha",
    ]


def test_a_multi_turn_sample_in_json(run):
    document = samples_json(run.root, "--step", 2, "--samples", 4, "--sort", "score")
    assert [sample["row"] for sample in document["samples"]] == [3, 2, 1, 0]
    row0 = document["samples"][-1]
    assert row0["response"] == "".join(text for _, text, _ in TURNS)
    assert row0["stop_reason"] == "no_tool_call"
    assert row0["advantage"] == pytest.approx(ADVANTAGES[0])  # the model's ids only: no 99s
    assert row0["extras"] == {"acc": ACC[0]}
    turns = [(t["role"], t["text"], t["tokens"], t["mask"]) for t in row0["turns"]]
    masks = {1: "model", 0: "tool"}
    assert turns == [(role, text, len(text), masks[m]) for role, text, m in TURNS]
    assert row0["turns"][0]["calls"] == [CALL] and row0["turns"][1]["results"] == [RESULT]
    for sample in document["samples"][:-1]:
        assert sample["response"] == RESPONSES[sample["row"]]
        assert [t["role"] for t in sample["turns"]] == ["assistant"]


# --- without a tokenizer, and errors -----------------------------------------------------------


def test_without_the_tokenizer_ids_are_shown_and_one_note(tmp_path):
    from stages.data.tokenizer import build_tiny_tokenizer

    store = build_run(tmp_path / "run", tmp_path / "no-such-tokenizer")
    result = inspect(store.root, "--step", 1, "--samples", 1)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "no-such-tokenizer could not be loaded" in notes[0]
    ids = build_tiny_tokenizer().encode(RESPONSES[0], add_special_tokens=False)
    assert f"    {ids}" in result.stdout.splitlines()
    document = samples_json(store.root, "--step", 1, "--samples", 1)
    assert document["samples"][0]["response"] is None
    assert document["samples"][0]["response_ids"] == ids and document["note"] == notes[0]


def _one_error_line(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


def test_a_skipped_stage_or_a_missing_step_is_one_line(run):
    line = _one_error_line(inspect(run.root, "--step", 3, "--samples", 2), 1)
    assert "step 3" in line and "no advantage artifact (skipped: disabled: for this test)" in line
    line = _one_error_line(inspect(run.root, "--step", 9, "--samples", 2), 1)
    assert "no step 9 (steps with a journal: 1-3)" in line
    line = _one_error_line(inspect(run.root, "--step", 1, "--samples", 2, "--where", "nope=1"), 1)
    assert "no column 'nope'" in line and "acc, data_source, pred, uid" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--step", 1, "--sort", "score"], "add --samples N"),
        (["--samples", 2], "--samples 2 needs --step K"),
        (["--step", 1, "--stage", "reward", "--samples", 2], "drop --stage reward"),
        (["--step", 1, "--samples", 2, "--where", "acc"], "expected KEY=VALUE"),
    ],
)
def test_sample_option_misuse_is_a_usage_error(run, args, expected):
    assert expected in _one_error_line(inspect(run.root, *args), 2)


def test_an_artifact_directory_with_samples_is_a_usage_error(run):
    line = _one_error_line(inspect(run.artifact_path(1, "reward"), "--samples", 2), 2)
    assert "is an artifact directory; --samples, --sort and --where" in line


def page_of(run, step: int, out: Path) -> dict:
    result = inspect(run.root, "--step", step, "--html", out)
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(out)
    page = out.read_text(encoding="utf-8")
    return json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])


def test_the_html_page_holds_each_response_with_its_own_values(run, tmp_path):
    """The page joins like --samples: generation order, each row's own score and advantage on
    every token of its response_mask."""
    data = page_of(run, 1, tmp_path / "step1.html")
    assert data["step"] == 1 and list(data["channels"]) == ["advantage"]  # no log-probs stored
    rows = data["samples"]
    assert ["".join(t["t"] for t in s["tokens"]) for s in rows] == RESPONSES
    assert [s["score"] for s in rows] == pytest.approx(SCORES)
    assert [s["uid"] for s in rows] == UIDS
    for sample, advantage in zip(rows, ADVANTAGES, strict=True):
        assert {t["advantage"] for t in sample["tokens"]} == {advantage}
    assert data["channels"]["advantage"]["scale"] == 1.5


def test_the_html_page_of_an_agent_step_greys_the_tools_tokens(run, tmp_path):
    data = page_of(run, 2, tmp_path / "step2.html")
    first = data["samples"][0]["tokens"]
    text = "".join(t["t"] for t in first)
    assert text == "".join(turn for _, turn, _ in TURNS)
    tool = [t["m"] for t in first][len(CALL_TEXT) : len(CALL_TEXT) + len("alpha")]
    assert tool == [0] * len("alpha")


def test_inspect_without_samples_prints_what_it_did(run):
    """The calls without --samples print what flows/runs/report.py returns, as before."""
    assert inspect(run.root).stdout == run_report.run_table(run) + "\n"
    assert inspect(run.root, "--step", 2).stdout == run_report.step_text(run, 2) + "\n"
    document = run_report.run_json(run, 1, None)
    assert inspect(run.root, "--step", 1, "--json").stdout == json.dumps(document, indent=1) + "\n"
    stage = run_report.stage_text(run, 1, "balance")
    assert inspect(run.root, "--step", 1, "--stage", "balance").stdout == stage + "\n"


# --- trained runs (slow) -----------------------------------------------------------------------


def _train(root: Path, make_demo_inputs, tiny_run_overrides, *extra: str) -> RunStore:
    """2 tiny steps without validation or checkpoints (tests/conftest.py's tiny run)."""
    from flows.train import train

    demo = make_demo_inputs(root / "demo")
    quick = ("trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=0")
    overrides = tiny_run_overrides(demo, root, 2, *quick, *extra)
    return RunStore(train(REPO / "configs" / "demo-cpu.yaml", overrides, str(root / "run")).run_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness) -> RunStore:
    return _train(tmp_path_factory.mktemp("trained"), make_demo_inputs, tiny_run_overrides)


@pytest.fixture(scope="module")
def agent_trained(
    tmp_path_factory,
    make_demo_inputs,
    tiny_run_overrides,
    prefect_harness,
    write_lookup_tool_config,
):
    root = tmp_path_factory.mktemp("agent")
    write_lookup_tool_config(root / "tools.yaml")
    return _train(
        root,
        make_demo_inputs,
        tiny_run_overrides,
        "data.max_response_length=24",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root / 'tools.yaml'}",
        "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
    )


def _rescored(store: RunStore, step: int, sample: dict) -> dict:
    """The demo scorer run again on the sample's own decoded response and its own prompt's
    answer (the step input, in generation order)."""
    from stages.data import demo_compute_score, load_tokenizer

    tokenizer = load_tokenizer(store.load_config()["actor_rollout_ref"]["model"]["tokenizer_path"])
    rows = load_artifact(store.input_path(step)).non_tensor_batch
    text = tokenizer.decode(sample["response_ids"], skip_special_tokens=True)
    answer = rows[K.REWARD_MODEL][sample["row"]]["ground_truth"]
    return demo_compute_score(
        sample["data_source"], text, answer, rows[K.EXTRA_INFO][sample["row"]]
    )


def _check_own_scores(store: RunStore, step: int) -> list[dict]:
    perm = load_artifact(store.artifact_path(step, "balance")).batch[K.BALANCE_ORDER].tolist()
    assert perm != sorted(perm)  # balance reordered the rows: a join by position would be wrong
    document = samples_json(store.root, "--step", step, "--samples", 8)
    assert [sample["row"] for sample in document["samples"]] == list(range(8))
    assert [sample["batch_row"] for sample in document["samples"]] == np.argsort(perm).tolist()
    for sample in document["samples"]:
        expected = _rescored(store, step, sample)
        assert sample["score"] == pytest.approx(expected["score"], abs=1e-6)
        assert (sample["extras"]["acc"], sample["extras"]["pred"]) == (
            expected["acc"], expected["pred"],
        )  # fmt: skip
    return document["samples"]


@pytest.mark.slow
def test_a_trained_step_shows_each_response_with_its_own_score(trained):
    for step in (1, 2):
        samples = _check_own_scores(trained, step)
        for a in samples:  # GRPO: in a group, the higher score has the higher advantage
            for b in samples:
                if a["uid"] == b["uid"] and a["score"] > b["score"] + 1e-6:
                    assert a["advantage"] > b["advantage"]
    result = inspect(trained.root, "--step", 2, "--samples", 3, "--sort", "score")
    assert result.exit_code == 0, result.output
    scores = [
        float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("  score ")
    ]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert "note:" not in result.stdout  # the run's tokenizer was found


@pytest.mark.slow
def test_a_trained_agent_step_shows_its_turns(agent_trained):
    for step in (1, 2):
        samples = _check_own_scores(agent_trained, step)
        rollout = load_artifact(agent_trained.artifact_path(step, "rollout"))
        for sample in samples:  # scored inside the rollout, in generation order
            row_score = float(rollout.batch[K.RM_SCORES][sample["row"]].sum())
            assert sample["score"] == pytest.approx(row_score, abs=1e-6)
            assert sum(turn["tokens"] for turn in sample["turns"]) == len(sample["response_ids"])
            for turn in sample["turns"]:
                assert turn["mask"] == {"assistant": "model", "tool": "tool"}[turn["role"]]
    result = inspect(agent_trained.root, "--step", 1, "--samples", 2)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n    turn 1  assistant  ") == 2


@pytest.mark.slow
def test_a_step_that_recomputed_its_old_log_probs_shows_the_trainers_entropy(
    tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness, tmp_path
):
    """Without bypass the old_log_prob stage keeps its per-token entropy; the page's
    ``entropy`` channel shows, on each sample's tokens, that artifact's row of the sample."""
    import math

    from transformers import AutoConfig

    from flows.runs.samples import load_step_samples

    run = _train(
        tmp_path_factory.mktemp("recomputed"), make_demo_inputs, tiny_run_overrides,
        "algorithm.rollout_correction.bypass_mode=false",
    )  # fmt: skip
    data = page_of(run, 2, tmp_path / "step2.html")
    assert list(data["channels"]) == ["advantage", "ratio", "log_prob", "entropy"]
    record = run.read_journal(2).record("old_log_prob")
    entropys = load_artifact(record.artifact).batch[K.ENTROPYS]  # balanced order
    vocab = AutoConfig.from_pretrained(run.load_config()["actor_rollout_ref"]["model"]["path"])
    bound = math.log(vocab.vocab_size)
    batch_rows = {s.row: s.batch_row for s in load_step_samples(run, 2).samples}
    for sample in data["samples"]:
        values = [t["entropy"] for t in sample["tokens"]]
        expected = entropys[batch_rows[sample["row"]], : len(values)].tolist()
        assert values == pytest.approx(expected, abs=1e-6)
        assert all(0 <= v <= bound + 1e-4 for v in values)
    assert data["channels"]["entropy"]["scale"] > 0
