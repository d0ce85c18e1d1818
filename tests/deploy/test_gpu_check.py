"""bench/gpu_check.sh's preparation, checked without a GPU: the wheels it carries cover what
ppoflow needs beside the CUDA image's packages, and its training part runs on the CPU."""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
#: the GPU machine's python: requirement markers are evaluated for it
GPU_PYTHON = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
#: left behind on purpose (bench/gpu_wheels.txt's header): the GPU run logs to the console and
#: TensorBoard
NOT_CARRIED = {"mlflow", "wandb"}
SDISTS = {"deepspeed", "antlr4-python3-runtime"}


def _names(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {_norm(line) for line in lines if line.strip() and not line.startswith("#")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_closure(root: str, stop: set[str]) -> set[str]:
    """Every distribution ``root`` needs on the GPU python, requested extras included, found in
    this environment; the walk does not enter ``stop``."""
    found: set[str] = set()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [(root, ())]
    while todo:
        name, extras = todo.pop()
        if _norm(name) in stop or (_norm(name), extras) in seen:
            continue
        seen.add((_norm(name), extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a marker-less optional import of another platform
        found.add(_norm(name))
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = ("", *extras)
            if req.marker is None or any(
                req.marker.evaluate({**GPU_PYTHON, "extra": extra}) for extra in wanted
            ):
                todo.append((req.name, tuple(sorted(req.extras))))
    return found


def test_carried_wheels_and_the_image_cover_what_ppoflow_needs():
    image = _names(REPO / "bench" / "gpu_image_packages.txt")
    carried = _names(REPO / "bench" / "gpu_wheels.txt") | SDISTS
    needed = required_closure("ppoflow", stop=NOT_CARRIED) - {"ppoflow"}
    missing = sorted(needed - image - carried)
    assert not missing, f"add to bench/gpu_wheels.txt (needed, not in the image): {missing}"


def test_every_carried_package_is_installed_to_pin_its_version():
    carried = _names(REPO / "bench" / "gpu_wheels.txt") | SDISTS
    absent = []
    for name in sorted(carried):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    assert not absent, f"--fetch-wheels pins from .venv, which lacks {absent}"


@pytest.mark.slow
def test_training_part_trains_checkpoints_and_resumes_on_the_cpu(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [
            sys.executable,
            "bench/gpu_train.py",
            "--cpu-smoke",
            "--report",
            str(report),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = report.read_text()
    assert "- train: 2 steps and the checkpoint" in text and "- resume: 2 more steps" in text
    rows = [line for line in text.splitlines() if re.match(r"\| \d", line)]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 3 (resumed)", "| 4"]
    # CPU: no MFU or device memory (no known peak), every stage time present
    for row in rows:
        cells = row.strip("| ").split(" | ")
        assert cells[-2:] == ["–", "–"], row
        assert all(float(cell) > 0 for cell in cells[1:5]), row  # gen, ref, update, step seconds


@pytest.mark.slow
@pytest.mark.parametrize("part", ["mfu", "rollout"])
def test_figure_parts_run_their_code_path_on_the_cpu(part, tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", part, "--cpu-smoke", "--zero-stage", "0",
         "--report", str(report)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = report.read_text()
    if part == "mfu":  # both forward layouts measured
        assert "- `trimmed`: " in text and "- `packed`: " in text
    else:
        assert "tokens/s" in text
