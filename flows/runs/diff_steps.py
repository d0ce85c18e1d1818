"""One run's step for ``ppoflow diff`` (flows/runs/diff.py): its journal, its artifacts loaded on
demand and checked, and each stage's rows in generation order.

:class:`StepArtifacts` loads an artifact only when asked, after the checks ``ppoflow inspect``
makes: the artifacts the journal names lie in the run (or a run it branched from,
``RunStore.check_journal_paths``), each manifest holds the stage and fingerprint the journal
records (``check_recorded_artifact``; the step input: its fingerprint), every file is hashed
(``verify="full"``), and every stage's artifact has the step input's row count.

Row order: the balance stage reorders the whole step batch after the rollout, so
:meth:`StepArtifacts.inverses` replays the step's reorders in run order exactly as
flows/runs/samples.py ``load_step_samples`` does (its ``checked_permutation`` checks each one) and gives,
per stage, ``inverse[i]``: the artifact row that holds generation row i.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K
from dataproto.artifact import Verify, load_artifact, read_manifest
from flows.runs.report import RunReportError, check_recorded_artifact
from flows.runs.samples import checked_permutation, response_side
from flows.runs.store import JOURNAL_FILE, RunStore, StageRecord, StepJournal
from stages.stage import Stage

#: the step input's name among the stages (its artifact is ``step_<k>/input``)
INPUT_STAGE = "input"


def prompts(data: DataProto) -> tuple[list[str | None], list[list[int]]]:
    """(uid per row, attended prompt ids per row) of a step input."""
    rows = len(data)
    uids = data.non_tensor_batch.get(K.UID)
    uid_list = [None] * rows if uids is None else [str(uid) for uid in uids]
    if data.batch is None or K.PROMPT_INPUT_IDS not in data.batch:
        return uid_list, [[] for _ in range(rows)]
    ids = data.batch[K.PROMPT_INPUT_IDS]
    mask = (
        data.batch[K.PROMPT_ATTENTION_MASK].bool()
        if K.PROMPT_ATTENTION_MASK in data.batch
        else None
    )
    return uid_list, [(ids[i] if mask is None else ids[i][mask[i]]).tolist() for i in range(rows)]


class StepArtifacts:
    """One run's step: its journal, its artifacts loaded on demand (each checked against the
    journal and hashed), and the generation-order inverses of the stages' artifacts.

    Raises (from its methods):
        RunReportError: an artifact holds another stage's or fingerprint's output than the
            journal records, or another row count than the step input; a broken permutation.
        ArtifactError: an artifact is missing or fails ``verify``.
        ValueError: the journal names an artifact outside the run and the runs it branched from.
    """

    def __init__(
        self, store: RunStore, journal: StepJournal, verify: Verify, stages: Sequence[Stage]
    ) -> None:
        self.store, self.journal, self.verify = store, journal, verify
        self.reorders = {s.name: s.reorders for s in stages if s.reorders is not None}
        self._loaded: dict[str, DataProto] = {}
        self._inverses: dict[str, np.ndarray] | None = None
        self._checked = False

    def _record(self, stage: str) -> StageRecord | None:
        return next((r for r in self.journal.stages if r.stage == stage), None)

    def _check_paths(self) -> None:
        if not self._checked:
            self.store.check_journal_paths(self.journal)
            self._checked = True

    def input(self) -> DataProto:
        """The step input, after checking it holds the fingerprint the journal records."""
        if INPUT_STAGE not in self._loaded:
            self._check_paths()
            path = self.journal.input_artifact
            held = read_manifest(path).get("fingerprint")
            if held != self.journal.input_fingerprint:
                raise RunReportError(
                    f"{path}: holds fingerprint {str(held)[:16]}…, but "
                    f"{self.store.step_dir(self.journal.step)}/{JOURNAL_FILE} records "
                    f"{str(self.journal.input_fingerprint)[:16]}… for the step input (the "
                    "artifact was replaced); restore it, or re-run the step"
                )
            self._loaded[INPUT_STAGE] = load_artifact(path, verify=self.verify)
        return self._loaded[INPUT_STAGE]

    def load(self, stage: str) -> DataProto | None:
        """The stage's artifact (None: skipped or not recorded), checked against the journal."""
        if stage == INPUT_STAGE:
            return self.input()
        record = self._record(stage)
        if record is None or record.artifact is None:
            return None
        if stage not in self._loaded:
            self._check_paths()
            check_recorded_artifact(self.store, self.journal.step, record)
            data = load_artifact(record.artifact, verify=self.verify)
            rows = len(self.input())
            if len(data) != rows:
                raise RunReportError(
                    f"{record.artifact}: {len(data)} rows, but step {self.journal.step}'s "
                    f"input has {rows}"
                )
            self._loaded[stage] = data
        return self._loaded[stage]

    def inverses(self) -> dict[str, np.ndarray]:
        """Stage → [i]: the artifact row of generation row i, the step flow's reorders replayed
        (flows/runs/samples.py ``load_step_samples``)."""
        if self._inverses is None:
            rows = len(self.input())
            order = np.arange(rows)
            found = {INPUT_STAGE: np.arange(rows)}
            for record in self.journal.stages:
                if record.artifact is None:
                    continue
                found[record.stage] = np.argsort(order)
                if record.stage in self.reorders:
                    key = self.reorders[record.stage]
                    data = self.load(record.stage)
                    order = order[checked_permutation(data, key, rows, record.stage)]
            self._inverses = found
        return self._inverses

    def responses(self) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
        """(responses, response_mask, valid lengths) in generation order, from the first
        artifact in run order that holds ``responses`` (the rollout); None when none does."""
        self._check_paths()
        for stage in (INPUT_STAGE, *(r.stage for r in self.journal.stages if r.artifact)):
            path = (
                self.journal.input_artifact
                if stage == INPUT_STAGE
                else self._record(stage).artifact
            )
            batch = read_manifest(path).get("batch") or {}
            if K.RESPONSES in (batch.get("keys") or ()):
                data = self.load(stage)
                if K.RESPONSE_MASK in data.batch:
                    return response_side((data, self.inverses()[stage]))
        return None


__all__ = ["INPUT_STAGE", "StepArtifacts", "prompts"]
