"""``ppoflow diff RUN_A RUN_B [--step K] [--stage S] [--json]``: the first stage whose artifact
differs, its keys, the first differing sample in generation order (decoded) and the largest
per-token differences; exit status 0 identical, 1 different, 2 bad input.

Fast tests read hand-made run directories (the tiny byte-level tokenizer, so a response's text
is its bytes), two steps of 4 rows each in generation order:

    row  uid  prompt  response  advantage  (RLOO branch)  old_log_probs
    0    u0   q0      "aa"      -1.5       -2.5           -0.1 per token
    1    u0   q1      "bbb"     -0.5       -0.5           -0.2
    2    u1   q2      "c"        0.5        0.75          -0.3
    3    u1   q3      "dddd"     1.5        1.5           -0.4

balance's permutation is [2, 0, 3, 1] (batch row j = generation row PERM[j]), so the reward,
old_log_prob and advantage artifacts hold row 2 first: a diff by position would name the wrong
sample. Each advantage row holds 99.0 outside its response_mask. The "branch" is a re-run branch
of the run (``rerun.json``) that reuses the run's step 2 artifacts up to old_log_prob and has its
own advantage artifact with the RLOO column, as ``ppoflow rerun --from advantage
algorithm.adv_estimator=rloo`` leaves it.

The slow test trains 2 tiny steps, re-runs step 2's advantage with RLOO for real and plants a
token in a copy of the run.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dataproto import DataProto
from dataproto import keys as K
from dataproto.artifact import ArtifactRef, load_artifact, read_manifest, save_artifact
from flows.cli.app import app
from flows.runs.diff import DiffInputError, diff_runs, run_order
from flows.runs.store import RunStore, StageRecord, StepJournal

REPO = Path(__file__).resolve().parents[2]
RESPONSES = ["aa", "bbb", "c", "dddd"]
ADVANTAGES = [-1.5, -0.5, 0.5, 1.5]
RLOO = [-2.5, -0.5, 0.75, 1.5]
OLD_LOG_PROBS = [-0.1, -0.2, -0.3, -0.4]
UIDS = ["u0", "u0", "u1", "u1"]
PERM = [2, 0, 3, 1]
P, R = 4, 8
STAGES = ["rollout", "balance", "reward", "old_log_prob", "advantage"]


def diff(*args: object):
    return CliRunner().invoke(app, ["diff", *map(str, args)])


def diff_json(*args: object, code: int = 1) -> dict:
    result = diff(*args, "--json")
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


# --- the hand-made runs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from stages.data.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(directory)
    return directory


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _right_padded(rows: list[list[int]], fill: int = 0) -> torch.Tensor:
    out = torch.full((len(rows), R), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _balanced(values: list) -> list:
    return [values[j] for j in PERM]


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def step_input(tokenizer, step: int, uids: list[str] = UIDS) -> DataProto:
    prompts = [_ids(tokenizer, f"q{i}") for i in range(4)]  # 2 ids each, left-padded to P
    ids = torch.tensor([[tokenizer.pad_token_id] * (P - len(p)) + p for p in prompts])
    mask = (torch.arange(P) >= P - 2).long().expand(4, P).clone()
    return DataProto.from_dict(
        {K.PROMPT_INPUT_IDS: ids, K.PROMPT_ATTENTION_MASK: mask},
        {K.UID: _objects([f"{uid}-{step}" for uid in uids])},
        {K.GLOBAL_STEPS: step},
    )


def _per_token(values: list[float], mask: torch.Tensor, outside: float = 99.0) -> torch.Tensor:
    """(4, R) in the balanced order: each row's value on its response_mask, ``outside`` else."""
    balanced_mask = mask[torch.tensor(PERM)].bool()
    column = torch.tensor(_balanced(values))[:, None].expand(4, R)
    return torch.where(balanced_mask, column, torch.full((4, R), outside))


def deltas(tokenizer, advantages: list[float] = ADVANTAGES) -> dict[str, DataProto]:
    """Each stage's delta (module docstring)."""
    rows = [_ids(tokenizer, text) for text in RESPONSES]
    mask = _right_padded([[1] * len(row) for row in rows])
    scores = torch.tensor(_balanced([0.1, 0.2, 0.3, 0.4]))
    return {
        "rollout": DataProto.from_dict(
            {K.RESPONSES: _right_padded(rows, tokenizer.pad_token_id), K.RESPONSE_MASK: mask}
        ),
        "balance": DataProto.from_dict({K.BALANCE_ORDER: torch.tensor(PERM)}),
        "reward": DataProto.from_dict(
            {K.SEQ_SCORES: scores}, {"acc": _objects(_balanced([0.0, 1.0, 1.0, 0.0]))}
        ),
        "old_log_prob": DataProto.from_dict(
            {K.OLD_LOG_PROBS: _per_token(OLD_LOG_PROBS, mask, 0.0)}
        ),
        "advantage": DataProto.from_dict(
            {
                K.ADVANTAGES: _per_token(advantages, mask),
                K.RETURNS: _per_token(advantages, mask),
            }
        ),
    }


def _record(stage: str, ref: ArtifactRef, status: str = "ran") -> StageRecord:
    return StageRecord(stage, status, "cache miss", ref.path, ref.fingerprint, f"key-{stage}",
                       ref.rows, ref.nbytes, 0.1)  # fmt: skip


def write_step(store: RunStore, tokenizer, step: int, uids: list[str] = UIDS) -> None:
    input_ref = store.save_input(step, step_input(tokenizer, step, uids))
    records = []
    for stage, delta in deltas(tokenizer).items():
        records.append(
            _record(stage, save_artifact(delta, store.artifact_path(step, stage), stage=stage))
        )
        if stage == "reward":
            records.append(StageRecord("values", "skipped", "disabled: uses_critic is False"))
    store.write_journal(StepJournal(step, "done", input_ref.path, input_ref.fingerprint, records))


def _save_config(store: RunStore, tokenizer_dir: Path | str) -> None:
    model = {"path": str(tokenizer_dir), "tokenizer_path": str(tokenizer_dir)}
    store.save_config(
        {"actor_rollout_ref": {"model": model}, "algorithm": {"adv_estimator": "grpo"}}
    )


def build_run(root: Path, tokenizer, tokenizer_dir: Path | str, uids: list[str] = UIDS) -> Path:
    """The run of the module docstring (steps 1 and 2); its config names ``tokenizer_dir``."""
    store = RunStore(root)
    _save_config(store, tokenizer_dir)
    for step in (1, 2):
        write_step(store, tokenizer, step, uids)
    return root


def build_branch(root: Path, parent: Path, tokenizer, tokenizer_dir: Path) -> Path:
    """A re-run branch of ``parent``'s step 2 from advantage with the RLOO column (docstring)."""
    store = RunStore(root)
    _save_config(store, tokenizer_dir)
    store.save_json("rerun.json", {"parent_run_dir": str(parent), "step": 2, "from": "advantage",
                                   "to": "advantage",
                                   "overrides": ["algorithm.adv_estimator=rloo"]})  # fmt: skip
    original = RunStore(parent).read_journal(2)
    records = []
    for record in original.stages:
        if record.stage == "advantage":
            ref = save_artifact(deltas(tokenizer, RLOO)["advantage"],
                                store.artifact_path(2, "advantage"), stage="advantage")  # fmt: skip
            records.append(_record("advantage", ref))
        else:  # reused from the parent: its artifact, in the parent's directory
            status = "skipped" if record.artifact is None else "cached"
            records.append(StageRecord(record.stage, status, f"reused from {parent} step 2",
                                       record.artifact, record.fingerprint))  # fmt: skip
    store.write_journal(StepJournal(2, "done", original.input_artifact,
                                    original.input_fingerprint, records))  # fmt: skip
    return root


def replace_artifact(run: Path, step: int, stage: str, change) -> None:
    """Rewrite a stage's artifact with the artifact API after ``change(data)`` (its manifest's
    stage and extra kept, so it stays valid) and record its new fingerprint in the journal."""
    path = run / f"step_{step}" / stage
    manifest, data = read_manifest(path), load_artifact(path)
    change(data)
    ref = save_artifact(data, path, stage=manifest["stage"], extra=manifest["extra"],
                        overwrite=True, digest=manifest["digest"])  # fmt: skip
    store = RunStore(run)
    journal = store.read_journal(step)
    record = journal.record(stage)
    record.fingerprint, record.nbytes = ref.fingerprint, ref.nbytes
    store.write_journal(journal)


def plant_token(run: Path, step: int, row: int, position: int, token: int) -> None:
    """One token of ``responses`` changed in one row of step ``step``'s rollout artifact."""

    def change(data: DataProto) -> None:
        responses = data.batch[K.RESPONSES].clone()
        responses[row, position] = token
        data.batch[K.RESPONSES] = responses

    replace_artifact(run, step, "rollout", change)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer, tokenizer_dir) -> Path:
    return build_run(tmp_path_factory.mktemp("diff") / "run", tokenizer, tokenizer_dir)


@pytest.fixture(scope="module")
def branch(tmp_path_factory, run, tokenizer, tokenizer_dir) -> Path:
    root = tmp_path_factory.mktemp("branch") / "rloo"
    return build_branch(root, run, tokenizer, tokenizer_dir)


@pytest.fixture(scope="module")
def planted(tmp_path_factory, run, tokenizer) -> Path:
    """A copy of the run whose step 2 rollout has "x" instead of "c" (generation row 2)."""
    copy = Path(shutil.copytree(run, tmp_path_factory.mktemp("planted") / "run"))
    plant_token(copy, 2, 2, 0, _ids(tokenizer, "x")[0])
    return copy


# --- identical runs ----------------------------------------------------------------------------


def test_identical_runs_exit_0(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "copy")
    result = diff(run, copy)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        f"a         {run}",
        f"b         {copy}",
        "relation  a and b have the same step 1 input",
        "steps     compared 1-2",
    ]
    assert lines[-1] == (
        "identical: every stage both runs recorded at steps 1-2 has the same artifact "
        "fingerprint (12 artifacts compared, 2 stages skipped by both)"
    )
    document = diff_json(run, copy, code=0)
    assert document["identical"] is True and document["finding"] is None
    assert diff(run, run).exit_code == 0  # a run against itself


# --- a planted token ---------------------------------------------------------------------------


def test_a_planted_token_names_the_rollout_the_key_the_row_and_both_texts(run, planted):
    result = diff(run, planted)
    assert result.exit_code == 1, result.output
    text = result.stdout
    assert "result    step 2 differs, first at stage rollout" in text
    verdicts = {line.split()[0]: line.split()[3] for line in
                text.split("stages of step 2 in run order\n")[1].split("\n\n")[0].splitlines()[1:]}  # fmt: skip
    assert verdicts == {"input": "same", "rollout": "differs", "balance": "same", "reward": "same",
                        "values": "skipped", "old_log_prob": "same", "advantage": "same"}  # fmt: skip
    keys = text.split("keys that differ in rollout (4 rows, compared in generation order)\n")[1]
    assert keys.splitlines()[:2] == [
        "  key        layer   a             b             rows differing",
        "  responses  tensor  int64 (4, 8)  int64 (4, 8)  1 of 4",
    ]
    row = text.split("first differing row: ")[1].splitlines()
    assert row == [
        "2 (generation order; batch row 2 in a, 2 in b)",
        "  uid          u1-2",
        "  differs in   responses",
        "  prompt (a and b, 2 tokens)",
        "    q2",
        "  response a (1 tokens)",
        "    c",
        "  response b (1 tokens)",
        "    x",
        f"  first differing response token: position 0: {_token(run, 'c')} 'c' in a, "
        f"{_token(run, 'x')} 'x' in b",
    ]
    assert "largest per-token differences" not in text  # no token-level key in the rollout


def _token(run: Path, text: str) -> int:
    from stages.data.tokenizer import build_tiny_tokenizer

    return _ids(build_tiny_tokenizer(), text)[0]


def test_a_planted_token_in_json(run, planted):
    document = diff_json(run, planted)
    assert document["differing_steps"] == [2]
    assert [s["first_stage"] for s in document["steps"]] == [None, "rollout"]
    finding = document["finding"]
    assert finding["first_stage"] == "rollout" and finding["rows"] == 4
    assert finding["keys"] == [{"key": "responses", "layer": "tensor", "shape_a": [4, R],
                                "shape_b": [4, R], "dtype_a": "int64", "dtype_b": "int64",
                                "rows": [2]}]  # fmt: skip
    row = finding["row"]
    assert (row["row"], row["keys"], row["first_token"]) == (2, ["responses"], 0)
    assert (row["a"]["response"], row["b"]["response"]) == ("c", "x")
    assert row["a"]["prompt"] == row["b"]["prompt"] == "q2"
    assert finding["tokens"] == []


def test_a_planted_token_in_a_balanced_stage_is_named_by_its_generation_row(run, tmp_path):
    """A change in row 0 of the advantage artifact (balanced) is generation row 2's."""
    copy = Path(shutil.copytree(run, tmp_path / "copy"))

    def change(data: DataProto) -> None:
        advantages = data.batch[K.ADVANTAGES].clone()
        advantages[0, 0] += 0.25
        data.batch[K.ADVANTAGES] = advantages

    replace_artifact(copy, 1, "advantage", change)
    finding = diff_json(run, copy)["finding"]
    assert finding["step"] == 1 and finding["first_stage"] == "advantage"
    assert finding["row"]["row"] == PERM[0] == 2
    assert (finding["row"]["a"]["batch_row"], finding["row"]["b"]["batch_row"]) == (0, 0)
    assert finding["row"]["a"]["response"] == RESPONSES[2]  # the rollout's row of that sample
    (tokens,) = finding["tokens"]
    assert tokens["key"] == "advantages" and tokens["differing"] == 1
    assert tokens["compared"] == sum(map(len, RESPONSES))
    (top,) = tokens["top"]
    assert (top["row"], top["token"], top["last"]) == (2, 0, 0)
    assert (top["a"], top["b"], top["delta"]) == pytest.approx((0.5, 0.75, 0.25))


# --- a re-run branch with another estimator ----------------------------------------------------


def test_a_branch_with_another_estimator_names_the_advantage_and_its_tokens(run, branch):
    result = diff(run, branch)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[2:5] == [
        "relation  b is a re-run branch of a (step 2, from advantage to advantage, overrides "
        "algorithm.adv_estimator=rloo)",
        "steps     compared 2; only in a (not compared): 1",
        "result    step 2 differs, first at stage advantage",
    ]
    stages = result.stdout.split("stages of step 2 in run order\n")[1].split("\n\n")[0]
    assert "  rollout       ran      cached   same" in stages.splitlines()
    assert "first differing row: 0 (generation order; batch row 1 in a, 1 in b)" in lines
    assert "  differs in   advantages, returns" in lines
    assert "  response (a and b, 2 tokens)" in lines  # the response itself is the same
    tokens = result.stdout.split("largest per-token differences over both runs' response_mask")[1]
    assert tokens.splitlines()[1:5] == [
        "  advantages: 3 of 10 tokens differ",
        "    row  token     a     b   |Δ|",
        "      0    0-1  -1.5  -2.5     1",
        "      2      0   0.5  0.75  0.25",
    ]
    assert "  returns: 3 of 10 tokens differ" in tokens


def test_a_branch_in_json(run, branch):
    document = diff_json(run, branch)
    assert document["compared_steps"] == [2] and document["only_in_a"] == [1]
    assert document["relation"].startswith("b is a re-run branch of a")
    finding = document["finding"]
    assert [k["key"] for k in finding["keys"]] == [K.ADVANTAGES, K.RETURNS]
    assert [k["rows"] for k in finding["keys"]] == [[0, 2], [0, 2]]
    top = finding["tokens"][0]["top"]
    assert [(t["row"], t["token"], t["last"], t["delta"]) for t in top] == [
        (0, 0, 1, pytest.approx(1.0)),
        (2, 0, 0, pytest.approx(0.25)),
    ]
    assert all(t["ratio"] is None for t in top)  # advantages are no log-probs


def test_a_branch_of_a_branch(run, branch, tokenizer, tokenizer_dir, tmp_path):
    """A branch of the branch that computes the same RLOO column: related to the run through
    the branch, and identical to the branch (the same content has the same fingerprint)."""
    again = build_branch(tmp_path / "again", branch, tokenizer, tokenizer_dir)
    found = diff_runs(str(run), str(again))
    assert found.relation.startswith(f"b is a re-run branch of a through {branch} (step 2, ")
    assert found.finding.first_stage == "advantage"
    result = diff(branch, again)
    assert result.exit_code == 0, result.output
    assert "relation  b is a re-run branch of a (step 2, from advantage" in result.stdout


def test_log_prob_differences_show_the_ratio(run, tmp_path):
    copy = Path(shutil.copytree(run, tmp_path / "copy"))
    batch_row = PERM.index(1)  # generation row 1 ("bbb"), token 2

    def change(data: DataProto) -> None:
        values = data.batch[K.OLD_LOG_PROBS].clone()
        values[batch_row, 2] += 0.5
        data.batch[K.OLD_LOG_PROBS] = values

    replace_artifact(copy, 2, "old_log_prob", change)
    result = diff(run, copy, "--step", 2)
    assert result.exit_code == 1, result.output
    tokens = result.stdout.split("largest per-token differences")[1].splitlines()
    assert tokens[1:4] == [
        "  old_log_probs: 1 of 10 tokens differ",
        "    row  token     a    b  |Δ|  exp(b−a)",
        f"      1      2  -0.2  0.3  0.5   {math.exp(0.5):.6g}",
    ]


# --- options -----------------------------------------------------------------------------------


def test_step_and_stage_choose_what_is_compared(run, planted):
    result = diff(run, planted, "--step", 1)
    assert result.exit_code == 0, result.output
    assert "identical: every stage both runs recorded at step 1" in result.stdout
    result = diff(run, planted, "--stage", "advantage")
    assert result.exit_code == 0, result.output
    assert "identical: stage advantage at steps 1-2 has the same artifact fingerprint" in (
        result.stdout
    )
    document = diff_json(run, planted, "--stage", "rollout")
    assert document["stage"] == "rollout" and document["differing_steps"] == [2]
    assert [s["stage"] for s in document["finding"]["stages"]] == ["rollout"]


def test_the_run_order_puts_a_stage_of_one_journal_after_the_one_it_follows():
    def journal(*stages: str) -> StepJournal:
        return StepJournal(1, stages=[StageRecord(s, "skipped", "x") for s in stages])

    assert run_order(journal("rollout", "reward", "advantage"),
                     journal("rollout", "reward", "ref_log_prob", "advantage")) == [
        "input", "rollout", "reward", "ref_log_prob", "advantage"]  # fmt: skip


# --- related runs and the tokenizer ------------------------------------------------------------


def test_other_uids_are_unrelated_the_same_prompts_with_other_meta_are_not(
    run, tokenizer, tokenizer_dir, tmp_path
):
    other = build_run(tmp_path / "other", tokenizer, tokenizer_dir, uids=["v0", "v0", "v1", "v1"])
    with pytest.raises(DiffInputError, match="uid differs in 4 of 4 rows"):
        diff_runs(str(run), str(other))
    copy = Path(shutil.copytree(run, tmp_path / "copy"))
    store = RunStore(copy)
    journal = store.read_journal(1)  # the same prompts and uids, another temperature
    data = load_artifact(journal.input_artifact)
    data.meta_info[K.TEMPERATURE] = 0.7
    ref = store.save_input(1, data)
    journal.input_fingerprint = ref.fingerprint
    store.write_journal(journal)
    found = diff_runs(str(run), str(copy))
    assert found.relation == "a and b have the same step 1 prompts (same uids and prompt ids)"
    assert found.finding.first_stage == "input"
    assert [(k.key, k.layer) for k in found.finding.artifact.keys] == [(K.TEMPERATURE, "meta_info")]


def test_without_a_tokenizer_ids_are_shown_under_one_note(tokenizer, tmp_path):
    missing = tmp_path / "no-such-tokenizer"
    run = build_run(tmp_path / "run", tokenizer, missing)
    copy = Path(shutil.copytree(run, tmp_path / "copy"))
    plant_token(copy, 1, 2, 0, _ids(tokenizer, "x")[0])
    result = diff(run, copy)
    assert result.exit_code == 1, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 2 and all("no-such-tokenizer could not be loaded" in n for n in notes)
    assert notes[0].startswith("note: run a: the run's tokenizer")
    assert f"    {_ids(tokenizer, 'x')}" in result.stdout.splitlines()
    row = diff_json(run, copy)["finding"]["row"]
    assert row["b"]["response"] is None and row["b"]["response_ids"] == _ids(tokenizer, "x")


# --- trained runs (slow) -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness) -> dict:
    """2 tiny GRPO steps with a scorer whose scores spread (the untrained model scores 0 on the
    demo task, which makes every estimator's advantages 0), and step 2 re-run from the
    advantage with RLOO."""
    from flows.rerun import rerun
    from flows.train import train

    root = make_demo_inputs(tmp_path_factory.mktemp("trained"))
    (root / "spread_score.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return float(sum(map(ord, solution_str)) % 5) / 4\n"
    )
    quick = ("trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=0")
    overrides = tiny_run_overrides(root, root, 2, *quick,
                                   f"reward.custom_reward_function.path={root}/spread_score.py")  # fmt: skip
    parent = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(root / "run")).run_dir
    branch = rerun(parent, 2, "advantage", "advantage", ["algorithm.adv_estimator=rloo"],
                   new_run_dir=str(root / "rloo")).run_dir  # fmt: skip
    return {"run": Path(parent), "rloo": Path(branch), "root": root}


@pytest.mark.slow
def test_a_trained_run_against_its_rerun_and_a_planted_token(trained, tokenizer):
    document = diff_json(trained["run"], trained["rloo"])
    finding = document["finding"]
    assert finding["step"] == 2 and finding["first_stage"] == "advantage"
    assert {k["key"] for k in finding["keys"]} == {K.ADVANTAGES, K.RETURNS}
    tokens = {t["key"]: t for t in finding["tokens"]}
    top = tokens[K.ADVANTAGES]["top"]
    assert top and top[0]["delta"] == max(t["delta"] for t in top) > 0
    advantages = {
        label: load_artifact(run / "step_2" / "advantage").batch[K.ADVANTAGES]
        for label, run in (("a", trained["run"]), ("b", trained["rloo"]))
    }
    perm = load_artifact(trained["run"] / "step_2" / "balance").batch[K.BALANCE_ORDER].tolist()
    for entry in top:  # generation row → the balanced row of both artifacts
        batch_row = perm.index(entry["row"])
        assert advantages["a"][batch_row, entry["token"]] == pytest.approx(entry["a"])
        assert advantages["b"][batch_row, entry["token"]] == pytest.approx(entry["b"])

    planted = Path(shutil.copytree(trained["run"], trained["root"] / "planted"))
    rollout = load_artifact(planted / "step_1" / "rollout")
    token = int(rollout.batch[K.RESPONSES][3, 1])
    plant_token(planted, 1, 3, 1, token + 1)
    result = diff(trained["run"], planted)
    assert result.exit_code == 1, result.output
    assert "result    step 1 differs, first at stage rollout" in result.stdout
    assert "first differing row: 3 (generation order; batch row 3 in a, 3 in b)" in result.stdout
    assert "note:" not in result.stdout  # the run's tokenizer was found
    row = diff_json(trained["run"], planted)["finding"]["row"]
    assert row["first_token"] == 1 and row["a"]["response"] != row["b"]["response"]
    assert row["b"]["response_ids"][1] == token + 1
