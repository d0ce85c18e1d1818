"""Bad model directories: missing, without config.json or tokenizer, with damaged weights.

``ppoflow train`` refuses each at start-up (the model phase reads the tokenizer, the engines
phase the weights): one line naming the directory, exit status 1, no step or checkpoint.
``ppoflow validate --model`` and ``ppoflow export --base`` check the directory they are given
before they read it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def copy_of(model: Path, target: Path, change: Callable[[Path], object]) -> Path:
    """A copy of the tiny model at ``target`` with ``change(target)`` applied."""
    shutil.copytree(model, target)
    change(target)
    return target


def without_tokenizer(model: Path) -> None:
    for path in model.iterdir():
        if path.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            path.unlink()


def truncate_weights(model: Path) -> None:
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


# (test id, what the input is, make(model, dir) -> the bad model directory, needles)
TRAIN = [
    ("missing-directory", "actor_rollout_ref.model.path that does not exist",
     lambda m, t: t / "no-model",
     ["does not exist (so it has no tokenizer_config.json or tokenizer.json)",
      "`ppoflow make-tiny-model DIR`"]),
    ("no-config-json", "a model directory without config.json",
     lambda m, t: copy_of(m, t / "m", lambda d: (d / "config.json").unlink()),
     ["has no config.json; write one with `ppoflow make-tiny-model DIR`"]),
    ("no-tokenizer", "a model directory without tokenizer files",
     lambda m, t: copy_of(m, t / "m", without_tokenizer),
     ["has no tokenizer_config.json or tokenizer.json"]),
    ("truncated-weights", "a truncated model.safetensors",
     lambda m, t: copy_of(m, t / "m", truncate_weights),
     ["cannot read its weights (model.safetensors: Error while deserializing header",
      "the file is truncated or damaged: restore it, or write the model directory again"]),
]  # fmt: skip


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    ("described", "make", "needles"), [pytest.param(*c[1:], id=c[0]) for c in TRAIN]
)
def test_a_bad_model_directory_stops_the_start(
    ppoflow, expect, demo, tmp_path, described, make, needles
):
    model = make(demo.model, tmp_path)
    result = ppoflow(
        "train", "demo-cpu",
        *demo.overrides(tmp_path, f"actor_rollout_ref.model.path={model}"),
        "--run-dir", tmp_path / "run",
    )  # fmt: skip
    expect(result, 1, f"model directory '{model}'", *needles, input=described)
    assert not list((tmp_path / "run").glob("step_*"))
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_a_tokenizer_path_that_does_not_exist(ppoflow, expect, demo, tmp_path):
    result = ppoflow(
        "train", "demo-cpu",
        *demo.overrides(tmp_path, f"actor_rollout_ref.model.tokenizer_path={tmp_path}/tok"),
        "--run-dir", tmp_path / "run",
    )  # fmt: skip
    expect(result, 1, f"model directory '{tmp_path}/tok' does not exist",
           input="actor_rollout_ref.model.tokenizer_path that does not exist")  # fmt: skip
    assert not list((tmp_path / "run").glob("step_*"))


# (test id, what the input is, command with {run} / {ckpt} / {model} / {out}, make(model, dir)
# -> the bad model directory, exit status, needles)
COMMANDS = [
    ("validate-model-missing", "`validate RUN --model DIR`, DIR does not exist",
     ["validate", "{run}", "--model", "{model}"], lambda m, t: t / "no-model", 2,
     ["--model {model} is not a model directory: it does not exist; pass a Hugging Face model "
      "directory"]),
    ("validate-model-no-config", "`validate RUN --model DIR`, DIR without config.json",
     ["validate", "{run}", "--model", "{model}"],
     lambda m, t: copy_of(m, t / "m", lambda d: (d / "config.json").unlink()), 2,
     ["--model {model} is not a model directory: it has no config.json"]),
    ("validate-model-truncated-weights", "`validate RUN --model DIR`, DIR's weights truncated",
     ["validate", "{run}", "--model", "{model}"], lambda m, t: copy_of(m, t / "m", truncate_weights),
     1, ["model directory '{model}': cannot read its weights (model.safetensors"]),
    ("export-base-missing", "`export CKPT OUT --base DIR`, DIR does not exist",
     ["export", "{ckpt}", "{out}", "--base", "{model}"], lambda m, t: t / "no-model", 2,
     ["--base {model} is not a model directory: it does not exist; pass the model directory the "
      "run started from"]),
    ("export-base-no-config", "`export CKPT OUT --base DIR`, DIR without config.json",
     ["export", "{ckpt}", "{out}", "--base", "{model}"],
     lambda m, t: copy_of(m, t / "m", lambda d: (d / "config.json").unlink()), 2,
     ["--base {model} is not a model directory: it has no config.json"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "make", "code", "needles"),
    [pytest.param(*c[1:], id=c[0]) for c in COMMANDS],
)
def test_a_bad_model_directory_given_to_a_command(
    ppoflow, expect, fill, unchanged, console, finished, demo, tmp_path,
    described, args, make, code, needles,
):  # fmt: skip
    model, out = make(demo.model, tmp_path), tmp_path / "out"
    paths = {"run": finished.run, "ckpt": finished.step, "model": model, "out": out}
    with unchanged(*finished.dirs):
        result = ppoflow(*fill(args, **paths))
    expect(result, code, *fill(needles, **paths), input=described, console=console())
    assert not out.exists()
