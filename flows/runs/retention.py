"""Artifact retention: which steps of a run keep their stage artifacts (``ppoflow.artifacts``).

A step's artifacts (``step_<k>/input`` and each stage's delta) are what ``ppoflow rerun`` and
``ppoflow inspect`` read and what a training into the same directory takes its cache hits from;
a long run's steps add up (the demo: about 0.2 MB per step, a 1024 × 8 batch with 1.5k-token
rows: hundreds of MB). After each step, step ``s`` keeps its artifacts when any of these holds
(:func:`kept_steps`):

- ``keep_last: K`` is set and ``s`` is one of the K newest steps (``s > last - K``);
- ``keep_every: N`` is set and ``s % N == 0``;
- ``s`` can be re-run from a checkpoint: step 1 (the base models), or a step whose previous step
  has a checkpoint under ``trainer.default_local_dir`` (``ppoflow rerun`` builds a step's
  engines from the checkpoint saved before it);
- a re-run branch of this run re-ran ``s``: the branch's journal names the parent's artifacts
  of that step. Branches are found from their ``rerun.json``, beside the run or through this
  machine's branch index, and from the ``<run>/branches/*.json`` notes older versions wrote
  (flows/runs/branches.py); ``ppoflow rerun`` writes nothing into the run.

With both settings null (the default) nothing is pruned. Any other step is pruned
(:func:`prune_step`): its journal is rewritten first with ``pruned`` set to the settings, then
its cache records are deleted (a training into the directory recomputes the step instead of
missing an artifact), then its artifact folders; the journal (records, metrics, weights
fingerprints) stays, so ``ppoflow inspect RUN`` still shows the step. A process killed part-way
leaves at most a temp folder, removed at the next start, and the next pass finishes the step.
A re-run or an inspection of a pruned step's artifacts is one error naming the settings
(:func:`pruned_error`).

A checkpoint deleted later (``trainer.max_actor_ckpt_to_keep``) stops protecting the step after
it, which the next pass prunes; the passes look at every step that still has artifacts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.cache.records import delete_record
from flows.runs.store import INPUT_NAME, RunStore, StepJournal
from stages.engines.checkpoint import checkpoint_steps

log = logging.getLogger(__name__)

SETTING = "ppoflow.artifacts"


@dataclass(frozen=True)
class RetentionPolicy:
    """``ppoflow.artifacts``: ``keep_last`` newest steps, every ``keep_every``-th step."""

    keep_last: int | None = None
    keep_every: int | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> RetentionPolicy:
        artifacts = cfg.ppoflow.artifacts
        return cls(artifacts.keep_last, artifacts.keep_every)

    @classmethod
    def from_settings(cls, settings: Any) -> RetentionPolicy:
        """The policy a journal's ``pruned`` field records (:meth:`settings`); a value that is
        not such a mapping (a hand-edited journal) reads as unknown settings, both null.

        >>> RetentionPolicy.from_settings({"keep_last": 2, "keep_every": None}).keep_last
        2
        """
        if not isinstance(settings, dict):
            return cls()
        return cls(settings.get("keep_last"), settings.get("keep_every"))

    @property
    def prunes(self) -> bool:
        """False when both settings are null: every step keeps its artifacts."""
        return self.keep_last is not None or self.keep_every is not None

    def settings(self) -> dict[str, int | None]:
        return {"keep_last": self.keep_last, "keep_every": self.keep_every}

    def describe(self) -> str:
        """``ppoflow.artifacts.keep_last=2, ppoflow.artifacts.keep_every=null``."""
        return ", ".join(
            f"{SETTING}.{name}={'null' if value is None else value}"
            for name, value in self.settings().items()
        )


def kept_steps(
    steps: Iterable[int], last: int, policy: RetentionPolicy, protected: set[int]
) -> set[int]:
    """The steps of ``steps`` that keep their artifacts after step ``last`` (module docstring);
    ``protected``: the steps a checkpoint or a branch needs.

    >>> sorted(kept_steps(range(1, 11), 10, RetentionPolicy(keep_last=2, keep_every=4), {1}))
    [1, 4, 8, 9, 10]
    >>> sorted(kept_steps(range(1, 4), 3, RetentionPolicy(), set()))  # retention off
    [1, 2, 3]
    """
    if not policy.prunes:
        return set(steps)
    keep = set()
    for step in steps:
        newest = policy.keep_last is not None and step > last - policy.keep_last
        every = policy.keep_every is not None and step % policy.keep_every == 0
        if newest or every or step in protected:
            keep.add(step)
    return keep


def protected_steps(store: RunStore, checkpoints: str | Path) -> set[int]:
    """Step 1, each step after a checkpoint under ``checkpoints``, and each step a branch of
    ``store`` re-ran (module docstring).

    Raises:
        ValueError: a branch note is unreadable, so what it protects is unknown.
    """
    after_checkpoints = {step + 1 for step in checkpoint_steps(checkpoints)}
    return {1, *after_checkpoints, *store.branches().values()}


def prune_step(store: RunStore, step: int, policy: RetentionPolicy) -> list[str]:
    """Remove step ``step``'s artifacts (module docstring); returns the removed folders."""
    journal = store.read_journal(step)
    if journal.pruned is None:
        journal.pruned = policy.settings()
        store.write_journal(journal)  # first: a kill after it leaves a step marked pruned
    for record in journal.stages:
        if record.cache_key and record.artifact and record.artifact.startswith(store.root):
            delete_record(store.cache_dir, record.cache_key)
    return store.remove_step_artifacts(step)


def pruned_error(journal: StepJournal, root: str) -> ValueError:
    """The error for reading a pruned step's artifacts."""
    settings = RetentionPolicy.from_settings(journal.pruned)
    return ValueError(
        f"step {journal.step} of {root} has no artifacts: retention pruned them "
        f"({settings.describe()}); re-run or inspect a step that keeps its artifacts (ppoflow "
        f"inspect {root} lists them), or train with a larger {SETTING}.keep_last / keep_every"
    )


@dataclass
class Retention:
    """A training's retention passes: after each step, prune the steps that still have
    artifacts and that no rule keeps. ``candidates`` starts as the steps on disk with artifacts
    (one directory listing at the start) and loses each step pruned."""

    store: RunStore
    policy: RetentionPolicy
    checkpoints: str
    candidates: set[int] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)  # what was warned about already

    @classmethod
    def open(cls, store: RunStore, cfg: Any) -> Retention:
        policy = RetentionPolicy.from_config(cfg)
        retention = cls(store, policy, str(cfg.trainer.default_local_dir))
        if policy.prunes:
            retention.candidates = {
                step for step in store.steps() if store.exists(f"step_{step}/{INPUT_NAME}")
            }
        return retention

    def after_step(self, step: int) -> list[int]:
        """The pass after step ``step`` finished (its journal ``done``, its checkpoint saved if
        one was due); returns the steps pruned. An unreadable branch note skips the pass with
        one warning: a branch's artifacts are never guessed away. A step that cannot be deleted
        (an ``OSError``: permissions, a busy file system) is one warning and is tried again after
        the next step; the training goes on."""
        if not self.policy.prunes:
            return []
        self.candidates.add(step)
        try:
            protected = protected_steps(self.store, self.checkpoints)
        except ValueError as err:
            self._warn_once("paused", "artifact retention paused: %s", err)
            return []
        doomed = sorted(self.candidates - kept_steps(self.candidates, step, self.policy, protected))
        pruned = []
        for old in doomed:
            try:
                prune_step(self.store, old, self.policy)
            except OSError as err:
                self._warn_once(
                    f"step {old}",
                    "artifact retention could not prune step %d (%s); it tries again after the "
                    "next step",
                    old,
                    err,
                )
                continue
            self.candidates.discard(old)
            pruned.append(old)
        return pruned

    def _warn_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._warned:
            self._warned.add(topic)
            log.warning(message, *args)
