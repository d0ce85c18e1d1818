"""Re-runs of steps with DAPO's dynamic sampling (flows/gen_rounds.py): which stages and which
journal ``ppoflow rerun`` works on.

A step of a run with ``algorithm.filter_groups.enable`` is two things on disk: its generation
rounds (``step_<k>/round_<r>/``: input, rollout, reward …, journal) and the training stages on
the batch the rounds kept (``step_<k>/``). So:

- ``ppoflow rerun RUN --step K --round R --from STAGE`` re-runs the generation stages of round R
  (``GENERATION_STAGES``) from STAGE, from the round's own input and journal, into
  ``<branch>/step_<k>/round_<r>/``; the step's training batch is not re-assembled (the rounds'
  filter decision is a pure function of their scores: :mod:`stages.algos.filter_groups`);
- without ``--round`` it re-runs the step's training stages (``TRAINING_STAGES``) from STAGE;
  a generation stage there has no record to start from, which is one error line saying so.
"""

from __future__ import annotations

from flows.gen_rounds import RoundStore
from flows.runs.store import RunStore
from stages.config import PPORunConfig
from stages.ppo import GENERATION_STAGES, PPO_STAGES, TRAINING_STAGES
from stages.stage import Stage


def planned_stages(cfg: PPORunConfig, gen_round: int | None, from_stage: str) -> tuple[Stage, ...]:
    """The stage list a re-run plans from (module docstring).

    Raises:
        ValueError: ``--round`` on a run without dynamic sampling, or ``--from`` a stage the
            chosen part of the step does not run.
    """
    if not cfg.algorithm.filter_groups.enable:
        if gen_round is not None:
            raise ValueError(
                f"--round {gen_round}: the run has no generation rounds "
                "(algorithm.filter_groups.enable = false); re-run the step without --round"
            )
        return PPO_STAGES
    stages, where = (
        (GENERATION_STAGES, f"round {gen_round}")
        if gen_round is not None
        else (TRAINING_STAGES, "the step's training batch (its generation rounds kept it)")
    )
    names = [stage.name for stage in stages]
    if from_stage in {stage.name for stage in PPO_STAGES} and from_stage not in names:
        hint = (
            "re-run the step without --round"
            if gen_round is not None
            else "re-run a round's stages with --round R"
        )
        raise ValueError(
            f"--from {from_stage!r}: with dynamic sampling {where} runs only {names}; {hint}"
        )
    return stages


def round_view(store: RunStore, gen_round: int | None) -> RunStore:
    """``store`` as seen by generation round ``gen_round`` (itself when None)."""
    return store if gen_round is None else RoundStore(store, gen_round)


def check_round(parent: RunStore, step: int, gen_round: int | None) -> None:
    """A ValueError naming the step's rounds when round ``gen_round`` of ``step`` has no journal."""
    if gen_round is None:
        return
    rounds, found = [], 1
    while parent.exists(f"step_{step}/round_{found}/journal.json"):
        rounds.append(found)
        found += 1
    if gen_round not in rounds:
        raise ValueError(
            f"--round {gen_round}: step {step} of {parent.root} has the generation rounds "
            f"{rounds or 'none'}"
        )
