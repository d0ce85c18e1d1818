"""Bad checkpoint directories: missing, not a ``global_step_N`` folder, a damaged file, a
damaged tracker, no checkpoint at all.

Every load checks the step's manifest first (docs/reliability.md, Checkpoint integrity), so a
damaged file is one ``CheckpointIntegrityError`` line naming it, before torch or DeepSpeed reads
anything; the checkpoints and the run stay as they are, and an export writes no directory. A
crafted file whose manifest was re-recorded passes that check and is refused by the safe load
(``torch.load(weights_only=True)``), naming the global it holds, never advising an unsafe load.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

FLIPPED = ("BLAKE3 digest", "differs from the manifest's", "(file altered or damaged); restore "
           "it or resume from another checkpoint")  # fmt: skip

# (test id, what the input is, file under the finished root or None, damage, command with
# {run} / {ckpt} / {model} / {out} / {tmp}, exit status, needles)
CASES = [
    ("export-folder-missing", "`export CKPT/global_step_7 OUT --base MODEL`, no such folder", None,
     None, ["export", "{ckpt}/global_step_7", "{out}", "--base", "{model}"], 2,
     ["{ckpt}/global_step_7 does not exist; expected a run directory or …/global_step_<K>",
      "steps with a checkpoint under {ckpt}: [1]"]),
    ("export-not-a-step-folder", "`export CKPT OUT --base MODEL`, the folder above the steps",
     None, None, ["export", "{ckpt}", "{out}", "--base", "{model}"], 2,
     ["{ckpt} is neither a run directory (config.json) nor a checkpoint folder; expected a run "
      "directory or …/global_step_<K> (or …/global_step_<K>/actor)"]),
    ("export-without-base", "`export CKPT/global_step_1 OUT` without `--base`", None, None,
     ["export", "{ckpt}/global_step_1", "{out}"], 2,
     ["is a checkpoint folder, which holds weights only; pass --base MODEL_DIR"]),
    ("export-flipped-weights", "`export RUN --step 1 OUT`, a flipped byte in the actor weights",
     "checkpoints/global_step_1/actor/state/mp_rank_00_model_states.pt", "flip",
     ["export", "{run}", "--step", "1", "{out}"], 2,
     ["checkpoint {ckpt}/global_step_1/actor/state/mp_rank_00_model_states.pt: ", *FLIPPED]),
    ("export-truncated-weights", "`export CKPT/global_step_1 OUT --base MODEL`, truncated weights",
     "checkpoints/global_step_1/actor/state/mp_rank_00_model_states.pt", "truncate",
     ["export", "{ckpt}/global_step_1", "{out}", "--base", "{model}"], 2,
     ["mp_rank_00_model_states.pt: ", " bytes, checkpoint_manifest.json says ",
      "(truncated or altered)"]),
    ("export-no-manifest", "`export …`, a checkpoint without its manifest",
     "checkpoints/global_step_1/checkpoint_manifest.json", "delete",
     ["export", "{ckpt}/global_step_1", "{out}", "--base", "{model}"], 2,
     ["{ckpt}/global_step_1: no checkpoint_manifest.json, so its files cannot be checked",
      "python -m stages.engines.checkpoint_manifest {ckpt}/global_step_1"]),
    ("validate-flipped-weights", "`validate RUN --step 1`, a flipped byte in the actor weights",
     "checkpoints/global_step_1/actor/state/mp_rank_00_model_states.pt", "flip",
     ["validate", "{run}", "--step", "1"], 2, ["mp_rank_00_model_states.pt: ", *FLIPPED]),
    ("resume-truncated-weights", "`resume RUN`, the only checkpoint's weights truncated",
     "checkpoints/global_step_1/actor/state/mp_rank_00_model_states.pt", "truncate",
     ["resume", "{run}", "trainer.total_training_steps=2"], 2,
     ["no checkpoint under {ckpt} passes its check (trainer.resume_mode=auto): skipped the "
      "checkpoint of step 1: ", "(truncated or altered); restore one, or start fresh with "
      "trainer.resume_mode=disable"]),
    ("resume-truncated-loader-state", "`resume RUN`, the checkpoint's data/state.json truncated",
     "checkpoints/global_step_1/data/state.json", "truncate",
     ["resume", "{run}", "trainer.total_training_steps=2"], 2,
     ["skipped the checkpoint of step 1: checkpoint {ckpt}/global_step_1/data/state.json: "]),
    ("resume-damaged-tracker", "`resume RUN`, latest_checkpointed_iteration.txt not a number",
     "checkpoints/latest_checkpointed_iteration.txt", "garbage",
     ["resume", "{run}", "trainer.total_training_steps=2"], 2,
     ["{ckpt}/latest_checkpointed_iteration.txt should hold a non-negative step number, got "
      "'not json'"]),
    ("resume-no-checkpoint", "`resume RUN trainer.default_local_dir=EMPTY`, no checkpoint there",
     None, None, ["resume", "{run}", "trainer.default_local_dir={tmp}/none"], 2,
     ["{run} has no checkpoint to resume from: trainer.default_local_dir {tmp}/none holds no "
      "latest_checkpointed_iteration.txt (the run saves one every trainer.save_freq=1 steps)"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "target", "how", "args", "code", "needles"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_a_bad_checkpoint_is_named_and_nothing_is_written(
    ppoflow, expect, fill, unchanged, damaged, console, finished, demo, tmp_path,
    described, target, how, args, code, needles,
):  # fmt: skip
    out = tmp_path / "out"
    paths = {"run": finished.run, "ckpt": finished.checkpoints, "model": demo.model, "out": out,
             "tmp": tmp_path}  # fmt: skip
    target = finished.root / (target or "run/config.json")  # without one: nothing damaged
    with damaged(target, how or (lambda path: None)), unchanged(*finished.dirs):
        result = ppoflow(*fill(args, **paths))
    expect(result, code, *fill(needles, **paths), input=described, console=console())
    assert not out.exists()


@pytest.mark.usefixtures("prefect_harness")
def test_train_with_a_resume_path_that_is_not_a_checkpoint(ppoflow, expect, demo, tmp_path):
    missing = tmp_path / "checkpoints" / "global_step_3"
    result = ppoflow(
        "train", "demo-cpu",
        *demo.overrides(tmp_path, "trainer.resume_mode=resume_path",
                        f"trainer.resume_from_path={missing}"),
        "--run-dir", tmp_path / "run",
    )  # fmt: skip
    expect(result, 1, f"trainer.resume_from_path='{missing}' must be an existing "
           "…/global_step_N checkpoint folder (resume_mode resume_path)",
           input="`trainer.resume_mode=resume_path` with a resume_from_path that does not exist")  # fmt: skip
    assert not list((tmp_path / "run").glob("step_*"))


@pytest.mark.usefixtures("prefect_harness")
def test_resume_with_a_flipped_byte_in_the_weights_keeps_the_run(
    ppoflow, expect, unchanged, damaged, finished
):
    """The resume's fast check (sizes) passes a flipped byte; the training's full check
    refuses it, before config.json is rewritten."""
    weights = finished.actor_weights
    with damaged(weights, "flip"), unchanged(*finished.dirs):
        result = ppoflow("resume", finished.run, "trainer.total_training_steps=2")
    expect(result, 2, f"no checkpoint under {finished.checkpoints} passes its check",
           f"checkpoint {weights}: BLAKE3 digest", *FLIPPED[1:],
           input="`resume RUN`, a flipped byte in the actor weights (found by the full check)")  # fmt: skip
    assert not (finished.run / "step_2").exists()


class _Calls:
    """A pickled object that names ``function`` (called with ``argument`` on an unsafe load)."""

    def __init__(self, function, argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self):
        return (self.function, (self.argument,))


def crafted(function, argument: str):
    """A damage of a checkpoint step folder: its actor weights file saved again with a pickled
    object naming ``function`` beside the weights, and the step's manifest re-recorded (so the
    digests check out, as they would for someone who can write the folder)."""

    def craft(step_dir: Path) -> None:
        import torch

        from stages.engines.checkpoint_manifest import STEP_MANIFEST, write_step_manifest
        from stages.engines.safe_load import weights_only_load

        weights = step_dir / "actor" / "state" / "mp_rank_00_model_states.pt"
        state = weights_only_load(weights)
        state["note"] = _Calls(function, argument)
        torch.save(state, weights)
        entries = json.loads((step_dir / STEP_MANIFEST).read_text())["files"]
        roles = sorted({entry["role"] for entry in entries})
        write_step_manifest(step_dir.parent, int(step_dir.name.rsplit("_", 1)[1]), roles)

    return craft


# (test id, what the input is, the global, command with {run} / {ckpt} / {out}, needles)
CRAFTED = [
    ("export-crafted-blocked-global",
     "`export RUN --step 1 OUT`, the actor weights re-saved with a pickled os.getenv call and "
     "the manifest re-recorded", os.getenv, ["export", "{run}", "--step", "1", "{out}"],
     ["refusing to read {ckpt}/global_step_1/actor/state/mp_rank_00_model_states.pt: it names "
      "os.getenv; the checkpoint holds a pickled object that safe loading refuses"]),
    ("export-crafted-unknown-global",
     "`export RUN --step 1 OUT`, the actor weights re-saved with a pickled textwrap.dedent call "
     "and the manifest re-recorded", textwrap.dedent, ["export", "{run}", "--step", "1", "{out}"],
     ["mp_rank_00_model_states.pt: it names textwrap.dedent; the checkpoint holds a pickled "
      "object that safe loading refuses", "restore it from a copy you trust"]),
    ("resume-crafted-blocked-global",
     "`resume RUN`, the actor weights re-saved with a pickled os.getenv call and the manifest "
     "re-recorded", os.getenv, ["resume", "{run}", "trainer.total_training_steps=2"],
     ["refusing to read {ckpt}/global_step_1/actor/state/mp_rank_00_model_states.pt: it names "
      "os.getenv; the checkpoint holds a pickled object that safe loading refuses"]),
]  # fmt: skip


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    ("described", "function", "args", "needles"),
    [pytest.param(*c[1:], id=c[0]) for c in CRAFTED],
)
def test_a_crafted_checkpoint_is_refused_naming_the_global(
    ppoflow, expect, fill, unchanged, damaged, console, finished, tmp_path,
    described, function, args, needles,
):  # fmt: skip
    out = tmp_path / "out"
    paths = {"run": finished.run, "ckpt": finished.checkpoints, "out": out}
    with damaged(finished.step, crafted(function, "HOME")), unchanged(*finished.dirs):
        result = ppoflow(*fill(args, **paths))
    line = expect(result, 2, *fill(needles, **paths), input=described, console=console())
    assert "weights_only" not in line and "damaged or truncated" not in line
    assert "weights_only" not in result.output  # torch's advice to load it unsafely: not passed on
    assert not out.exists() and not (finished.run / "step_2").exists()
