"""Where two runs part, down to the sample: ``ppoflow diff RUN_A RUN_B [--step K] [--stage S]``.

The two runs are any two run directories of the same prompts: two trainings, a run and one of
its re-run branches (``ppoflow rerun``: the branch's ``rerun.json`` names its parent), or two
branches. :func:`diff_runs` compares them in three passes, each cheaper than the next:

1. **Steps.** The steps both runs have a journal for are compared (``--step K``: only K, which
   both must have); steps of one run only are listed, not compared (a branch holds only the step
   it re-ran).
2. **Stages, by fingerprint.** For every compared step the two journals are walked in run order
   (the step input first, then the stages as the step recorded them; a stage recorded by one
   journal only is put after the stage it follows there). Identical fingerprints are identical
   artifacts (dataproto/fingerprint.py), so no artifact is read here. A stage is *same* (equal
   fingerprints, or skipped on both sides), *differs* (other fingerprints, or skipped on one
   side only) or *only in a* / *only in b* (recorded by one journal only: not compared, e.g. the
   stages after a branch's ``--to``). ``--stage S`` compares only S. The first step with a
   stage that differs is the finding; the first such stage in run order is named.
3. **The finding, by sample.** Both runs' artifacts of that stage are loaded with the safe loader
   (``load_artifact``, every file hashed), after checking that each lies in its run (or the run
   it branched from) and that its manifest holds the stage and fingerprint its journal records
   (``check_recorded_artifact``). The balance stage reorders the batch, so each run's reorders
   are replayed as ``ppoflow inspect --samples`` replays them (flows/runs/samples.py) and the
   rows are compared in generation order: the keys that differ, the first differing generation
   row with each run's prompt and response ids (decoded by the CLI with each run's tokenizer,
   ``load_decoder``), and the largest per-token differences of the token-level keys over the
   response mask (flows/runs/diff_rows.py).

**Related runs.** Two runs are related at the first compared step when one is a re-run branch of
the other or both branch from one run (``rerun.json``), or when their step inputs hold the same
prompts under the same uids in the same order: equal input fingerprints, else equal ``uid``
columns and equal prompt token ids row by row (the same data, ``data.train_batch_size`` and
``trainer.seed``: training derives the uids from the seed, the step and the row). Anything else
is *unrelated*: a diff of other prompts would only say that every sample differs.

Every bad input is one :class:`DiffInputError` (or another ValueError: a damaged journal or
artifact, named) before anything is compared: a path that is not a run directory, unrelated runs,
a ``--step`` one run lacks, a ``--stage`` a compared step's journal does not record. Nothing is
written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import fsspec
import torch

from dataproto.artifact import Verify
from dataproto.artifact_store import MANIFEST
from flows.runs.branches import parent_chain, read_rerun_info, same_run
from flows.runs.diff_rows import ArtifactDiff, Side, compare_artifacts
from flows.runs.diff_steps import INPUT_STAGE, StepArtifacts, prompts
from flows.runs.report import format_steps
from flows.runs.retention import pruned_error
from flows.runs.store import CONFIG_FILE, JOURNAL_FILE, RunStore, StepJournal
from stages.stage import Stage

Label = Literal["a", "b"]
Verdict = Literal["same", "skipped", "differs", "only in a", "only in b"]


class DiffInputError(ValueError):
    """Input ``ppoflow diff`` cannot compare: one line naming the run, step or stage and what
    would be right (exit status 2)."""


# --- results -----------------------------------------------------------------------------------


@dataclass
class StageVerdict:
    """One stage of a compared step on both sides: status (``ran`` / ``cached`` / ``skipped``,
    ``input`` for the step input, None: not recorded) and fingerprint (None: no artifact)."""

    stage: str
    status_a: str | None
    status_b: str | None
    fingerprint_a: str | None
    fingerprint_b: str | None

    @property
    def verdict(self) -> Verdict:
        if self.status_a is None or self.status_b is None:
            return "only in b" if self.status_a is None else "only in a"
        if self.fingerprint_a != self.fingerprint_b:
            return "differs"
        return "skipped" if self.fingerprint_a is None else "same"


@dataclass
class RowSide:
    """One run's view of a generation row: its row in the differing stage's artifact, its uid,
    its prompt ids (the attended ones) and response ids (those its attention mask covers)."""

    batch_row: int
    uid: str | None
    prompt_ids: list[int]
    response_ids: list[int] | None  # None: the step has no artifact with responses


@dataclass
class RowFinding:
    """The first generation row that differs, the keys that differ in it, both runs' view."""

    row: int
    keys: list[str]
    a: RowSide
    b: RowSide

    @property
    def first_token(self) -> int | None:
        """The first response position whose token differs (None: the responses are equal)."""
        ra, rb = self.a.response_ids, self.b.response_ids
        if ra is None or rb is None or ra == rb:
            return None
        return next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb)))


@dataclass
class StepDiff:
    """One compared step: its stages' verdicts in run order, the first stage that differs and,
    for the finding, how that stage's artifacts differ."""

    step: int
    stages: list[StageVerdict]
    first_stage: str | None = None
    artifact: ArtifactDiff | None = None
    row: RowFinding | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class RunDiff:
    """What :func:`diff_runs` found (module docstring)."""

    a: str
    b: str
    relation: str
    compared: list[int]
    only_a: list[int]
    only_b: list[int]
    stage: str | None
    steps: list[StepDiff]
    finding: StepDiff | None

    @property
    def identical(self) -> bool:
        return self.finding is None

    @property
    def differing_steps(self) -> list[int]:
        return [step.step for step in self.steps if step.first_stage is not None]


# --- the runs, their steps and stages ----------------------------------------------------------


def open_run(path: str, label: Label) -> RunStore:
    """The run directory ``path`` (run ``label``); a DiffInputError when it is none."""
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    if fs.isfile(f"{root}/{MANIFEST}"):
        raise DiffInputError(
            f"run {label}: {path} is an artifact directory ({MANIFEST}), not a run directory; "
            "pass the run directory that holds its step_<k>/ folder"
        )
    store = RunStore(path)
    if not (fs.isfile(f"{root}/{CONFIG_FILE}") or store.steps()):
        state = "is not a run directory" if fs.exists(root) else "does not exist"
        raise DiffInputError(
            f"run {label}: {path} {state}: expected a run directory ({CONFIG_FILE} and "
            f"step_<k>/{JOURNAL_FILE}, as ppoflow train and ppoflow rerun write it)"
        )
    return store


def choose_steps(
    a: RunStore, b: RunStore, step: int | None
) -> tuple[list[int], list[int], list[int]]:
    """(the steps to compare, those of a only, those of b only); a DiffInputError for a
    ``step`` one run lacks or runs without a step in common."""
    steps = {"a": a.steps(), "b": b.steps()}
    common = sorted(set(steps["a"]) & set(steps["b"]))
    only_a = sorted(set(steps["a"]) - set(common))
    only_b = sorted(set(steps["b"]) - set(common))
    if step is not None:
        for label, store in (("a", a), ("b", b)):
            if step not in steps[label]:
                raise DiffInputError(
                    f"--step {step}: run {label} ({store.root}) has no step {step} (steps with "
                    f"a journal: {format_steps(steps[label])}); compare a step both runs have: "
                    f"{format_steps(common)}"
                )
        return [step], only_a, only_b
    if not common:
        raise DiffInputError(
            f"runs a ({a.root}) and b ({b.root}) have no step in common (a: "
            f"{format_steps(steps['a'])}; b: {format_steps(steps['b'])}); compare runs that "
            "recorded the same step"
        )
    return common, only_a, only_b


def run_order(a: StepJournal, b: StepJournal) -> list[str]:
    """The stage names of both journals in run order: the input, a's stages, and each stage of
    b's only after the stage it follows in b."""
    names = [INPUT_STAGE, *(record.stage for record in a.stages)]
    previous = INPUT_STAGE
    for record in b.stages:
        if record.stage not in names:
            names.insert(names.index(previous) + 1, record.stage)
        previous = record.stage
    return names


def _status(journal: StepJournal, stage: str) -> tuple[str | None, str | None]:
    """(status, fingerprint) of ``stage`` in ``journal``; (None, None) when not recorded."""
    if stage == INPUT_STAGE:
        return "input", journal.input_fingerprint
    for record in journal.stages:
        if record.stage == stage:
            return record.status, record.fingerprint if record.artifact is not None else None
    return None, None


def stage_verdicts(a: StepJournal, b: StepJournal, stage: str | None) -> list[StageVerdict]:
    """Each stage's verdict in run order (only ``stage``'s when given)."""
    verdicts = []
    for name in run_order(a, b) if stage is None else [stage]:
        (status_a, fingerprint_a), (status_b, fingerprint_b) = _status(a, name), _status(b, name)
        verdicts.append(StageVerdict(name, status_a, status_b, fingerprint_a, fingerprint_b))
    return verdicts


def check_stage(journal: StepJournal, store: RunStore, label: Label, stage: str) -> None:
    """A DiffInputError unless ``journal`` records ``stage`` (the input always is)."""
    recorded = [INPUT_STAGE, *(record.stage for record in journal.stages)]
    if stage not in recorded:
        raise DiffInputError(
            f"--stage {stage}: step {journal.step} of run {label} ({store.root}) records no stage "
            f"{stage!r} (its journal records: {', '.join(recorded)}); name a stage both runs' "
            f"step {journal.step} journals record"
        )


# --- related runs ------------------------------------------------------------------------------


def _branch_info(root: str) -> str:
    info = read_rerun_info(root) or {}
    overrides = " ".join(info.get("overrides") or []) or "none"
    return (
        f"step {info.get('step')}, from {info.get('from')} to {info.get('to')}, "
        f"overrides {overrides}"
    )


def branch_relation(a: RunStore, b: RunStore) -> str | None:
    """How the runs are linked by their ``rerun.json`` files, or None when they are not."""
    if same_run(a.root, b.root):
        return "a and b are the same run directory"
    chain_a, chain_b = parent_chain(a.root), parent_chain(b.root)
    for label, other, root, chain in (("b", "a", b.root, chain_b), ("a", "b", a.root, chain_a)):
        ancestor = a.root if label == "b" else b.root
        if any(same_run(parent, ancestor) for parent in chain):
            via = "" if same_run(chain[0], ancestor) else f" through {chain[0]}"
            return f"{label} is a re-run branch of {other}{via} ({_branch_info(root)})"
    common = [p for p in chain_a if any(same_run(p, q) for q in chain_b)]
    if common:
        return f"a and b are re-run branches of {common[0]}"
    return None


def check_related(a: StepArtifacts, b: StepArtifacts) -> str:
    """How the runs are related at this step (module docstring); a DiffInputError when they
    are not."""
    linked = branch_relation(a.store, b.store)
    if linked is not None:
        return linked
    step = a.journal.step
    if a.journal.input_fingerprint == b.journal.input_fingerprint:
        return f"a and b have the same step {step} input"
    (uids_a, ids_a), (uids_b, ids_b) = prompts(a.input()), prompts(b.input())
    problems = []
    if len(uids_a) != len(uids_b):
        problems.append(f"{len(uids_a)} rows against {len(uids_b)}")
    else:
        uid_rows = sum(x != y for x, y in zip(uids_a, uids_b, strict=True))
        prompt_rows = sum(x != y for x, y in zip(ids_a, ids_b, strict=True))
        if uid_rows:
            problems.append(f"uid differs in {uid_rows} of {len(uids_a)} rows")
        if prompt_rows:
            problems.append(f"the prompt differs in {prompt_rows} of {len(uids_a)} rows")
    if not problems:
        return f"a and b have the same step {step} prompts (same uids and prompt ids)"
    raise DiffInputError(
        f"runs a ({a.store.root}) and b ({b.store.root}) are unrelated: their step {step} inputs "
        f"hold other prompts ({'; '.join(problems)}) and neither is a re-run branch of the other; "
        "ppoflow diff compares runs of the same prompts: two trainings of the same data and "
        "trainer.seed, a run and its re-run branches (ppoflow rerun), or two branches of one run"
    )


# --- the finding -------------------------------------------------------------------------------


def _row_side(run: StepArtifacts, stage: str, row: int, responses: tuple | None) -> RowSide:
    uids, prompt_ids = prompts(run.input())
    response_ids = None
    if responses is not None:
        ids, _, lengths = responses
        response_ids = ids[row, : lengths[row]].tolist()
    return RowSide(
        batch_row=int(run.inverses()[stage][row]),
        uid=uids[row],
        prompt_ids=prompt_ids[row],
        response_ids=response_ids,
    )


def _mask(sides: Sequence[tuple | None]) -> torch.Tensor | None:
    """The tokens sampled in both runs: their response masks (generation order) and-ed."""
    masks = [side[1].bool() for side in sides if side is not None]
    if not masks or any(m.shape != masks[0].shape for m in masks):
        return None
    return masks[0] & masks[-1]


def compare_stage(a: StepArtifacts, b: StepArtifacts, found: StepDiff) -> None:
    """Fill ``found`` (a step whose ``first_stage`` differs) with how the two artifacts of that
    stage differ, sample by sample (module docstring, pass 3)."""
    stage = found.first_stage
    for label, run in (("a", a), ("b", b)):
        if run.journal.pruned is not None:
            found.notes.append(
                f"run {label}: {pruned_error(run.journal, run.store.root)}; the stage is named "
                "from the journals' fingerprints, its keys and rows are not compared"
            )
    if any(run.journal.pruned is not None for run in (a, b)):
        return
    data_a, data_b = a.load(stage), b.load(stage)
    both = data_a is not None and data_b is not None
    sides = (
        Side(data_a, a.inverses()[stage] if both else None),
        Side(data_b, b.inverses()[stage] if both else None),
    )
    responses = (a.responses(), b.responses()) if both else (None, None)
    found.artifact = compare_artifacts(*sides, mask=_mask(responses))
    if not both:
        skipped = "a" if data_a is None else "b"
        found.notes.append(
            f"run {skipped} skipped {stage} (no artifact): its keys are those of the other run only"
        )
    row = found.artifact.first_row
    if row is not None:
        found.row = RowFinding(
            row,
            found.artifact.row_keys,
            _row_side(a, stage, row, responses[0]),
            _row_side(b, stage, row, responses[1]),
        )


def diff_runs(
    path_a: str,
    path_b: str,
    step: int | None = None,
    stage: str | None = None,
    verify: Verify = "full",
    stages: Sequence[Stage] | None = None,
) -> RunDiff:
    """Compare run ``path_a`` with run ``path_b`` (module docstring). ``stages``: where a
    stage's ``reorders`` key is looked up (default PPO_STAGES).

    Raises:
        DiffInputError: a path that is not a run directory, unrelated runs, a ``step`` one run
            lacks, a ``stage`` a compared step does not record.
        ValueError: a damaged journal, rerun.json or artifact (RunReportError, ArtifactError),
            named.
    """
    if stages is None:
        from stages.ppo import PPO_STAGES

        stages = PPO_STAGES
    a, b = open_run(path_a, "a"), open_run(path_b, "b")
    compared, only_a, only_b = choose_steps(a, b, step)
    journals = {k: (a.read_journal(k), b.read_journal(k)) for k in compared}
    if stage is not None:
        for ja, jb in journals.values():
            check_stage(ja, a, "a", stage)
            check_stage(jb, b, "b", stage)
    loaded = {k: (StepArtifacts(a, ja, verify, stages), StepArtifacts(b, jb, verify, stages))
              for k, (ja, jb) in journals.items()}  # fmt: skip
    relation = check_related(*loaded[compared[0]])
    steps = []
    for k, (ja, jb) in journals.items():
        verdicts = stage_verdicts(ja, jb, stage)
        first = next((v.stage for v in verdicts if v.verdict == "differs"), None)
        steps.append(StepDiff(k, verdicts, first))
    finding = next((s for s in steps if s.first_stage is not None), None)
    if finding is not None:
        compare_stage(*loaded[finding.step], finding)
    return RunDiff(a.root, b.root, relation, compared, only_a, only_b, stage, steps, finding)


__all__ = [
    "INPUT_STAGE",
    "DiffInputError",
    "RowFinding",
    "RowSide",
    "RunDiff",
    "StageVerdict",
    "StepArtifacts",
    "StepDiff",
    "branch_relation",
    "check_related",
    "diff_runs",
    "run_order",
    "stage_verdicts",
]
