"""What ``ppoflow inspect RUN --step K --samples N`` shows: one step's samples, decoded, each with
its own score, reward extras and advantage.

Row order is what this module is for. The step input and the rollout artifact are in generation
order: row i is the i-th sample generated, a prompt's n samples adjacent. The balance stage
reorders the whole step batch right after the rollout (``Stage.reorders``; ``flows/step_flow.py``
``apply_reorder``: new batch row j is old row ``perm[j]``), so the artifacts of every later stage
(reward, advantage, the updates) are in the balanced order, and pairing the rollout's row i with
the reward artifact's row i gives a response another sample's score. :func:`load_step_samples`
replays the reorders instead: walking the step's stage records in run order it keeps ``order``
(batch row j holds generation row ``order[j]``; ``order = order[perm]`` after a reordering stage)
and moves each stage's columns back to generation order through the ``order`` in effect when that
stage ran (``values[argsort(order)]``).

A :class:`Sample` is one generation row:

- ``row``: its generation index (step input, rollout); ``batch_row``: its index in the order the
  stages after the reorders saw (the row of the reward and advantage artifacts).
- ``score``: the reward stage's ``seq_scores`` (Σ_t ``rm_scores`` when it has none).
- ``advantage``: the mean of the advantage stage's ``advantages`` over the row's
  ``response_mask`` (the tokens the model sampled): the value each of those tokens holds for an
  outcome estimator (GRPO, RLOO, ReMax, …), their mean for GAE; None for an empty response.
- ``extras``: the reward extras named by ``meta_info["reward_extra_keys"]`` (e.g. ``acc``,
  ``pred``), from the reward artifact, or from the rollout's when the rollout scored the rows.
- ``columns``: every scalar non-tensor column of the step input, rollout and reward (``uid``,
  ``data_source``, the extras, ``agent_stop_reason``, …) as ``str(value)``, for ``--where``.
- ``turns``: a multi-turn agent rollout's ``agent_turns`` (``stages/agent/trajectory.py``: role,
  span in ``responses``, calls, results, seconds), else None.
- ``tokens``: per response position (as long as ``response_ids``): ``advantage`` (the advantage
  stage's ``advantages``), ``log_prob`` (the rollout's ``rollout_log_probs``: the sampler's
  log-probability of the token it chose) and, when the step has an ``old_log_prob`` artifact,
  ``ratio`` = exp(``old_log_probs`` − ``rollout_log_probs``) (the trainer's probability of the
  token over the rollout's; 1 in bypass mode) and, when that stage recomputed them (not in
  bypass mode), ``entropy`` (its ``entropys``: the entropy of the trainer's distribution at the
  position, at the rollout temperature); for a partial rollout, ``policy_version`` (the
  rollout's ``rollout_policy_versions``: the version of the weights that chose the token).

Texts are decoded with the run's tokenizer (``actor_rollout_ref.model.tokenizer_path`` of its
``config.json``, a relative path read from the directory the run started in, as ``ppoflow export``
reads it), special tokens kept, so the chat template and EOS show. When it cannot be loaded the
token ids are shown and :attr:`Decoder.note` says why, in one line. Printing (text, JSON) is
:mod:`flows.runs.samples_render`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K
from dataproto.artifact import Verify, load_artifact
from flows.runs.report import RunReportError, check_recorded_artifact, read_journals
from flows.runs.retention import pruned_error
from flows.runs.store import RunStore, StageRecord, StepJournal
from stages.agent.trajectory import AGENT_TURNS
from stages.stage import Stage

SortKey = Literal["score", "advantage"]
#: the stages whose artifacts a step's samples are joined from
NEEDED = ("rollout", "reward", "advantage")
#: joined too when the step has their artifact
OPTIONAL = ("old_log_prob",)
ADVANTAGE_RULE = "mean of advantages over the row's response_mask"
TOKENIZER_KEYS = ("actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.path")
IDS_SHOWN = "token ids shown instead of text"


@dataclass
class Sample:
    """One generation row of a step (module docstring for each field)."""

    row: int
    batch_row: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    score: float | None
    advantage: float | None
    extras: dict[str, Any]
    columns: dict[str, str]
    turns: list[dict[str, Any]] | None = None
    tokens: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class StepSamples:
    """Every sample of one step in generation order, and where its values came from."""

    run_dir: str
    step: int
    samples: list[Sample]
    score_source: str  # "reward.seq_scores" or "Σ reward.rm_scores"
    reordered_by: list[str]  # the stages whose permutation was replayed, in run order


# --- the join ----------------------------------------------------------------------------------


def _needed_records(
    store: RunStore, step: int
) -> tuple[StepJournal, list[StageRecord], dict[str, StageRecord]]:
    """(the step's journal, its records with an artifact in run order, those of :data:`NEEDED` by
    name); a pruned step or a needed stage without an artifact is one :class:`RunReportError`."""
    (journal,) = read_journals(store, step)
    if journal.pruned is not None:
        raise RunReportError(str(pruned_error(journal, store.root)))
    recorded = {record.stage: record for record in journal.stages}
    for name in NEEDED:
        record = recorded.get(name)
        if record is None or record.artifact is None:
            state = "not recorded" if record is None else f"{record.status}: {record.reason}"
            raise RunReportError(
                f"step {step} of {store.root} has no {name} artifact ({state}); --samples joins "
                f"the {', '.join(NEEDED)} artifacts of a step that has them (ppoflow inspect "
                f"{store.root} --step {step} lists its stages)"
            )
    store.check_journal_paths(journal)
    ran = [record for record in journal.stages if record.artifact is not None]
    found = [name for name in OPTIONAL if recorded.get(name) and recorded[name].artifact]
    return journal, ran, {name: recorded[name] for name in (*NEEDED, *found)}


def checked_permutation(data: DataProto, key: str, rows: int, stage: str) -> np.ndarray:
    """(rows,) the stage's permutation; a RunReportError unless it is one of 0…rows−1."""
    perm = data.batch[key].cpu().numpy() if data.batch is not None and key in data.batch else None
    if perm is None or perm.shape != (rows,) or not (np.sort(perm) == np.arange(rows)).all():
        shown = "missing" if perm is None else f"shape {perm.shape}, values {perm.tolist()[:16]}"
        raise RunReportError(
            f"stage {stage!r}: {key!r} is not a permutation of 0…{rows - 1} ({shown})"
        )
    return perm


def _objects(values: np.ndarray) -> list[Any]:
    """A non-tensor column as plain Python values (numpy scalars unwrapped)."""
    return [value.item() if isinstance(value, np.generic) else value for value in values]


def _scalar_columns(data: DataProto, inverse: np.ndarray) -> dict[str, list[str]]:
    """name → str(value) per generation row, for each 1-D column of scalars (``--where``)."""
    out = {}
    for name, values in data.non_tensor_batch.items():
        items = _objects(values) if values.ndim == 1 else None
        if items is not None and all(v is None or isinstance(v, str | int | float) for v in items):
            out[name] = [str(items[j]) for j in inverse]
    return out


def _extras(
    names: Sequence[str], sources: Sequence[tuple[DataProto, np.ndarray]]
) -> dict[str, list]:
    """name → value per generation row of each reward extra, from the first source holding it."""
    out = {}
    for name in names:
        for data, inverse in sources:
            if name in data.non_tensor_batch:
                values = _objects(data.non_tensor_batch[name])
                out[name] = [values[j] for j in inverse]
                break
    return out


def _seq_scores(reward: DataProto) -> tuple[torch.Tensor, str]:
    """(B,) the reward stage's sequence scores and where they came from."""
    if K.SEQ_SCORES in reward.batch:
        return reward.batch[K.SEQ_SCORES].float(), f"reward.{K.SEQ_SCORES}"
    return reward.batch[K.RM_SCORES].float().sum(-1), f"Σ reward.{K.RM_SCORES}"


def masked_row_means(values: torch.Tensor, mask: torch.Tensor) -> list[float | None]:
    """(B, R) values, (B, R) {0,1} mask → per row the mean over the mask (None where empty).

    >>> values = torch.tensor([[1.0, 3.0, 9.0], [2.0, 2.0, 2.0]])
    >>> masked_row_means(values, torch.tensor([[1, 1, 0], [0, 0, 0]]))
    [2.0, None]
    """
    mask = mask.to(values.dtype)
    count = mask.sum(-1)  # (B,)
    total = (values * mask).sum(-1)  # (B,)
    return [None if n == 0 else float(t / n) for t, n in zip(total, count, strict=True)]


def load_step_samples(
    store: RunStore, step: int, verify: Verify = "full", stages: Sequence[Stage] | None = None
) -> StepSamples:
    """Every sample of step ``step``, joined across its artifacts in generation order (module
    docstring). ``stages``: where a stage's ``reorders`` key is looked up (default PPO_STAGES).

    Raises:
        RunReportError: no such step, a pruned step, a needed stage skipped or not yet run, an
            artifact that holds another stage's output or rows, a broken permutation.
        ArtifactError: an artifact is missing or fails ``verify``.
        ValueError: the journal names an artifact outside the run.
    """
    if stages is None:
        from stages.ppo import PPO_STAGES

        stages = PPO_STAGES
    reorders = {stage.name: stage.reorders for stage in stages if stage.reorders is not None}
    journal, ran, needed = _needed_records(store, step)
    step_input = load_artifact(journal.input_artifact, verify=verify)
    rows = len(step_input)

    def load(record: StageRecord) -> DataProto:
        check_recorded_artifact(store, step, record)
        data = load_artifact(record.artifact, verify=verify)
        if len(data) != rows:
            raise RunReportError(
                f"{record.artifact}: {len(data)} rows, but step {step}'s input has {rows}"
            )
        return data

    order, inverses, reordered_by = np.arange(rows), {}, []
    for record in ran:  # replay the step flow's reorders (flows/step_flow.py apply_reorder)
        inverses[record.stage] = np.argsort(order)  # [i]: the artifact row of generation row i
        if record.stage in reorders:
            order = order[
                checked_permutation(load(record), reorders[record.stage], rows, record.stage)
            ]
            reordered_by.append(record.stage)
    sources = {"input": (step_input, np.arange(rows))}
    sources |= {name: (load(record), inverses[name]) for name, record in needed.items()}
    return StepSamples(
        run_dir=store.root,
        step=step,
        samples=_samples(sources, np.argsort(order)),
        score_source=_seq_scores(sources["reward"][0])[1],
        reordered_by=reordered_by,
    )


def _rows(source: tuple[DataProto, np.ndarray], key: str) -> torch.Tensor:
    """Tensor ``key`` of a (data, inverse) source in generation order: ``values[inverse]``."""
    data, inverse = source
    return data.batch[key][torch.as_tensor(inverse)]


def response_side(
    rollout: tuple[DataProto, np.ndarray],
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(responses (B, R), response_mask (B, R), valid lengths (B,)) in generation order. A row's
    valid ids are those the attention mask covers (tool turns included); a rollout whose
    attention mask was left out (derived: prompt mask ‖ response_mask) counts the response mask's.
    """
    responses, response_mask = _rows(rollout, K.RESPONSES), _rows(rollout, K.RESPONSE_MASK)
    valid = response_mask  # (B, R): a single-turn rollout's attention mask is derived from it
    if K.ATTENTION_MASK in rollout[0].batch:
        valid = _rows(rollout, K.ATTENTION_MASK)[:, -responses.shape[1] :]
    return responses, response_mask, valid.sum(-1).tolist()


def _samples(
    sources: dict[str, tuple[DataProto, np.ndarray]], batch_rows: np.ndarray
) -> list[Sample]:
    """The samples in generation order from ``sources``: name → (artifact, inverse), the
    inverse mapping generation row i to the artifact's row (the step input's is the identity)."""
    step_input, (rollout, _), (reward, _) = (
        sources["input"][0],
        sources["rollout"],
        sources["reward"],
    )
    prompt_ids = step_input.batch[K.PROMPT_INPUT_IDS]  # (B, P), generation order
    prompt_mask = step_input.batch[K.PROMPT_ATTENTION_MASK].bool()  # (B, P)
    responses, response_mask, lengths = response_side(sources["rollout"])
    scores = _seq_scores(reward)[0][torch.as_tensor(sources["reward"][1])].tolist()  # (B,)
    advantages = masked_row_means(_rows(sources["advantage"], K.ADVANTAGES).float(), response_mask)
    columns: dict[str, list[str]] = {}
    for name in ("input", "rollout", "reward"):
        columns.update(_scalar_columns(*sources[name]))
    extra_keys = reward.meta_info.get(K.REWARD_EXTRA_KEYS) or rollout.meta_info.get(
        K.REWARD_EXTRA_KEYS, []
    )
    extras = _extras(list(extra_keys), [sources["reward"], sources["rollout"]])
    turns = _extras([AGENT_TURNS], [sources["rollout"]]).get(AGENT_TURNS)
    tokens = token_values(sources)
    return [
        Sample(
            row=i,
            batch_row=int(batch_rows[i]),
            prompt_ids=prompt_ids[i][prompt_mask[i]].tolist(),
            response_ids=responses[i, : lengths[i]].tolist(),
            response_mask=response_mask[i, : lengths[i]].tolist(),
            score=scores[i],
            advantage=advantages[i],
            extras={name: values[i] for name, values in extras.items()},
            columns={name: values[i] for name, values in columns.items()},
            turns=None if turns is None else list(turns[i]),
            tokens={name: values[i, : lengths[i]].tolist() for name, values in tokens.items()},
        )
        for i in range(len(step_input))
    ]


def token_values(sources: dict[str, tuple[DataProto, np.ndarray]]) -> dict[str, torch.Tensor]:
    """The per-token values of :attr:`Sample.tokens`, each (B, R) in generation order."""
    values = {"advantage": _rows(sources["advantage"], K.ADVANTAGES).float()}
    rollout = sources["rollout"]
    if K.ROLLOUT_LOG_PROBS in rollout[0].batch:
        values["log_prob"] = _rows(rollout, K.ROLLOUT_LOG_PROBS).float()
        if "old_log_prob" in sources:
            old = _rows(sources["old_log_prob"], K.OLD_LOG_PROBS).float()
            values["ratio"] = torch.exp(old - values["log_prob"])
    if K.ROLLOUT_POLICY_VERSIONS in rollout[0].batch:
        values["policy_version"] = _rows(rollout, K.ROLLOUT_POLICY_VERSIONS).float()
    if "old_log_prob" in sources and K.ENTROPYS in sources["old_log_prob"][0].batch:
        values["entropy"] = _rows(sources["old_log_prob"], K.ENTROPYS).float()
    return values


# --- choosing which to show --------------------------------------------------------------------


def parse_where(items: Sequence[str]) -> list[tuple[str, str]]:
    """``--where KEY=VALUE`` items as (key, value); the value is all after the first ``=``.

    >>> parse_where(["acc=1.0", "pred=a=b"])
    [('acc', '1.0'), ('pred', 'a=b')]
    """
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--where {item!r}: expected KEY=VALUE, e.g. data_source=openai/gsm8k")
        pairs.append((key.strip(), value))
    return pairs


def _sort_key(value: float | None) -> tuple[bool, float]:
    """Highest first, None and NaN last."""
    missing = value is None or math.isnan(value)
    return missing, 0.0 if missing else -value


def select_samples(
    found: StepSamples, where: Sequence[tuple[str, str]], sort: SortKey | None, limit: int
) -> tuple[list[Sample], int]:
    """(the first ``limit`` samples whose columns equal every ``where`` value, by ``sort``
    descending — ties and no sort keep generation order —, how many matched).

    Raises:
        RunReportError: a ``where`` key that is no column of the step (the columns listed).
    """
    known = sorted({name for sample in found.samples for name in sample.columns})
    for key, _ in where:
        if key not in known:
            raise RunReportError(
                f"--where {key}=…: step {found.step} has no column {key!r}; the columns to "
                f"filter by: {', '.join(known)}"
            )
    matched = [s for s in found.samples if all(s.columns[k] == v for k, v in where)]
    if sort is not None:
        matched.sort(key=lambda sample: _sort_key(getattr(sample, sort)))
    return matched[:limit], len(matched)


def column_values(found: StepSamples, key: str, most: int = 8) -> list[str]:
    """The distinct values of column ``key`` in the step (at most ``most``), for a where that
    matched nothing."""
    return sorted({sample.columns.get(key, "") for sample in found.samples})[:most]


# --- decoding ----------------------------------------------------------------------------------


@dataclass
class Decoder:
    """The run's tokenizer (None when it could not be loaded: ``note`` says why)."""

    tokenizer: Any | None
    path: str | None
    note: str | None = None

    @property
    def problem(self) -> str | None:
        """Why there is no tokenizer (the note without its framing), or None."""
        if self.note is None:
            return None
        return self.note.removeprefix("note: ").removesuffix(f"; {IDS_SHOWN}")

    def text(self, ids: Sequence[int]) -> str | None:
        """The ids decoded, special tokens kept; None without a tokenizer."""
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def show(self, ids: Sequence[int]) -> str:
        """The decoded text for a terminal (:func:`printable`), or the ids as a list without a
        tokenizer."""
        text = self.text(ids)
        return str(list(ids)) if text is None else printable(text)


def printable(text: str) -> str:
    r"""``text`` with control characters other than newline and tab escaped, so a sampled byte
    cannot move the terminal's cursor or clear it.

    >>> printable("a\x1b[2J\tb\r")
    'a\\x1b[2J\tb\\r'
    """
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ascii(ch)[1:-1] for ch in text)


def _config_value(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def load_decoder(store: RunStore) -> Decoder:
    """The tokenizer of the run's config (module docstring); a note instead when it has none or
    it cannot be loaded (token ids are then shown)."""
    try:
        config = store.load_config()
    except (FileNotFoundError, ValueError) as err:
        return Decoder(None, None, f"note: no tokenizer ({err}); {IDS_SHOWN}")
    path = _config_value(config, TOKENIZER_KEYS[0]) or _config_value(config, TOKENIZER_KEYS[1])
    if path is None:
        return Decoder(None, None, f"note: {TOKENIZER_KEYS[0]} is not set; {IDS_SHOWN}")
    if store.is_local:
        from flows.export import run_path

        path = run_path(store.root, str(path))
    try:
        from stages.data import load_tokenizer

        return Decoder(load_tokenizer(path), str(path))
    except Exception as err:  # any failure is shown in the note; the ids are still shown
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        return Decoder(
            None,
            str(path),
            f"note: the run's tokenizer {path} could not be loaded ({reason}); {IDS_SHOWN}",
        )
