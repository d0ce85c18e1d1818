#!/usr/bin/env bash
# ppoflow's GPU checks in one go, for a CUDA machine without network access (≤ 8 minutes).
#
# On the GPU machine, from the repository root:
#
#     bash bench/gpu_check.sh
#
# 1. prints the environment (nvidia-smi, python, torch / CUDA, nvcc, package versions);
# 2. installs the wheels found in bench/wheels (pip --no-index --no-deps into a private --target
#    folder that goes first on PYTHONPATH; the image's own packages are left untouched);
# 3. runs `pytest -m gpu tests/engines/test_gpu.py` (DeepSpeed bf16 / ZeRO-3 on CUDA, bf16 vs fp32
#    log-probs, HF rollouts, micro-batch split invariance in fp32 ZeRO-2, the actor worker), and
#    tests/engines/test_rollout_vllm.py (all but `slow`, gpu ones included) when vllm imports;
# 4. measures the GPU figures (bench/gpu_check.py): peak bf16 matmul, actor-update MFU
#    (6·N·tokens/s ÷ peak), HF rollout tokens/s and, when vllm imports, vLLM's, LoRA rank 8 / 64
#    against full training (step time, peak memory, optimizer state; a Qwen2.5-0.5B-shaped
#    model built from a config), and the actor → vLLM weight sync's time and host memory
#    (bench/weight_sync.py, 100M parameters);
# 5. writes a short report to $OUT/gpu_report.md (./gpu_report.md when OUT is unset) and the whole
#    log to gpu_check.log beside it.
# Every step has a time limit inside an overall budget (PPOFLOW_GPU_BUDGET_S, default 470 s); a step
# that fails is recorded in the report and the next one runs.
#
# Wheels. The CUDA image has python3 with torch, transformers, numpy, pytest, pyyaml, pyarrow,
# safetensors, fsspec, … but not deepspeed, tensordict, pydantic, or the config loader's omegaconf,
# hydra-core and antlr4 (the actor-worker test loads a YAML config), nor (for the LoRA part) peft
# and its accelerate and psutil; its transformers may be older than the one CI tests, so the CPU
# environment's version travels too. Fill bench/wheels on the CPU
# machine (network access, the project's .venv) with
#
#     bash bench/gpu_check.sh --fetch-wheels
#
# which pins the versions installed in .venv and runs
#
#     .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#         --platform manylinux2014_x86_64 -d bench/wheels tensordict==V pyvers==V hjson==V \
#         pydantic==V pydantic-core==V annotated-types==V typing-inspection==V typing-extensions==V \
#         omegaconf==V hydra-core==V transformers==V peft==V accelerate==V psutil==V
#     .venv/bin/python -m pip wheel --no-deps --no-build-isolation -w bench/wheels deepspeed==V \
#         antlr4-python3-runtime==V
#
# (deepspeed and antlr4-python3-runtime are sdists on PyPI: `pip wheel` builds their pure-Python
# wheels, deepspeed's with .venv's torch; its CUDA ops are JIT-compiled on the GPU machine.) About
# 20 MiB in all (transformers is 12 MiB of it); the device tool carries at most
# 64 MiB. bench/wheels is git-ignored (.gitignore line: /bench/wheels/), so name it in the tool's
# carry list. PPOFLOW_WHEEL_PYTHON (default 3.12) is the GPU python's version. vllm is far too large
# to carry; its checks run only where the image already has it. PPOFLOW_WHEEL_DIR overrides the
# wheel folder (both modes).
set -u -o pipefail

WHEEL_PACKAGES=(tensordict pyvers hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions
    omegaconf hydra-core transformers peft accelerate psutil)
SDIST_PACKAGES=(deepspeed antlr4-python3-runtime)

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
WHEEL_DIR=${PPOFLOW_WHEEL_DIR:-bench/wheels}

fetch_wheels() {
    local venv_python=.venv/bin/python pins=() name version
    for name in "${WHEEL_PACKAGES[@]}" "${SDIST_PACKAGES[@]}"; do
        version=$("$venv_python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
            echo "gpu_check: $name is not installed in .venv; install the project first" >&2
            return 1
        }
        pins+=("$name==$version")
    done
    mkdir -p "$WHEEL_DIR"
    "$venv_python" -m pip download --no-deps --only-binary=:all: \
        --python-version "${PPOFLOW_WHEEL_PYTHON:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEEL_DIR" "${pins[@]:0:${#WHEEL_PACKAGES[@]}}" || return 1
    "$venv_python" -m pip wheel --no-deps --no-build-isolation -w "$WHEEL_DIR" \
        "${pins[@]:${#WHEEL_PACKAGES[@]}}" || return 1
    du -sh "$WHEEL_DIR"
    ls "$WHEEL_DIR"
}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    fetch_wheels
    exit $?
fi

OUT_DIR=${OUT:-.}
REPORT=$OUT_DIR/gpu_report.md
LOG=$OUT_DIR/gpu_check.log
PY=${PPOFLOW_GPU_PYTHON:-python3}
BUDGET=${PPOFLOW_GPU_BUDGET_S:-470}
SITE=/tmp/ppoflow-site
mkdir -p "$OUT_DIR"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ppoflow-torch-extensions}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ -z "${CUDA_HOME:-}" ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
fi

report() { printf '%s\n' "$@" >>"$REPORT"; }
step() { printf '\n===== %s (t=%ss) =====\n' "$1" "$SECONDS"; }

# Seconds a step may take: its own limit, cut to what is left of the budget (0 = skip it).
allowance() {
    local left=$((BUDGET - SECONDS))
    if ((left < 20)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

# run_limited NAME LIMIT CMD...: run CMD under `timeout`, record its outcome in the report.
run_limited() {
    local name=$1 limit rc
    limit=$(allowance "$2")
    shift 2
    if ((limit == 0)); then
        report "- $name: skipped (time budget of ${BUDGET}s used up)"
        return 1
    fi
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    case $rc in
        0) report "- $name: ok" ;;
        124 | 137) report "- $name: **timed out** after ${limit}s" ;;
        *) report "- $name: **failed** (exit $rc)" ;;
    esac
    return "$rc"
}

step "environment"
cat >"$REPORT" <<EOF
# ppoflow GPU check — $(date -u '+%Y-%m-%d %H:%M UTC')

## Environment
\`\`\`
$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi unavailable")
$("$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1)
$( (nvcc --version 2>/dev/null || echo "nvcc not found") | tail -1)
EOF
nvidia-smi || true
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    report '```' "" "**No CUDA device visible to $PY: nothing else was run.**"
    echo "gpu_check: torch.cuda.is_available() is False" >&2
    exit 1
fi
# DeepSpeed JIT-builds FusedAdam for TORCH_CUDA_ARCH_LIST. The device's own capability, always: the
# CUDA image sets "9.0a", whose arch suffix DeepSpeed 0.19.8 cannot parse (int('0a') in
# compute_capability_args: every DeepSpeed test failed on 2026-12-04 until this was set).
# PPOFLOW_CUDA_ARCH overrides it.
TORCH_CUDA_ARCH_LIST=${PPOFLOW_CUDA_ARCH:-$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')}
export TORCH_CUDA_ARCH_LIST

step "wheels"
shopt -s nullglob
wheels=("$WHEEL_DIR"/*.whl)
if ((${#wheels[@]})); then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "${wheels[@]}" || echo "gpu_check: wheel install failed" >&2
else
    echo "no wheels in $WHEEL_DIR (fill it with: bash bench/gpu_check.sh --fetch-wheels)"
fi
"$PY" - >>"$REPORT" <<'EOF'
import importlib.metadata as metadata
names = ["deepspeed", "transformers", "tensordict", "pydantic", "omegaconf", "hydra-core", "peft", "vllm", "pytest"]
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
print(" | ".join(f"{name} {version(name)}" for name in names))
EOF
report '```' "" "## Tests"

step "imports"
if "$PY" -c 'import deepspeed, tensordict, pydantic, transformers, pytest
import dataproto, stages.engines.actor, stages.engines.rollout_hf, stages.config'; then
    step "pytest -m gpu tests/engines/test_gpu.py"
    run_limited "tests/engines/test_gpu.py (-m gpu)" 210 \
        "$PY" -m pytest -m gpu tests/engines/test_gpu.py -p no:cacheprovider -q -rfE \
        2>&1 | tee /tmp/ppoflow-pytest-gpu.log
    report '```' "$(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped|error)' /tmp/ppoflow-pytest-gpu.log | tail -20)" '```'
else
    report "- imports failed (deepspeed / tensordict / pydantic / ppoflow): see gpu_check.log; tests not run"
fi

if "$PY" -c 'import vllm' 2>/dev/null; then
    step "pytest tests/engines/test_rollout_vllm.py"
    run_limited "tests/engines/test_rollout_vllm.py (not slow, gpu included)" 150 \
        "$PY" -m pytest -m "not slow" tests/engines/test_rollout_vllm.py -p no:cacheprovider -q -rfE \
        2>&1 | tee /tmp/ppoflow-pytest-vllm.log
    report '```' "$(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped|error)' /tmp/ppoflow-pytest-vllm.log | tail -20)" '```'
else
    report "- tests/engines/test_rollout_vllm.py: not run, vllm does not import here"
fi

report "" "## Figures (bench/gpu_check.py)"
FIGURES=$OUT_DIR/.gpu_figures.md
: >"$FIGURES"
step "peak bf16 matmul"
run_limited "peak" 45 "$PY" bench/gpu_check.py peak --report "$FIGURES"
peak=$(sed -n 's/.*peak_tflops=\([0-9.]*\).*/\1/p' "$FIGURES" | tail -1)
step "actor update MFU"
run_limited "mfu" 110 "$PY" bench/gpu_check.py mfu --report "$FIGURES" --peak-tflops "${peak:-788}" \
    --zero-stage 2 --rows 64 --prompt 512 --response 512 --micro 16
step "rollout tokens/s"
run_limited "rollout" 110 "$PY" bench/gpu_check.py rollout --report "$FIGURES" \
    --rows 256 --prompt 128 --response 256
step "LoRA vs full training"
run_limited "lora" 150 "$PY" bench/gpu_check.py lora --report "$FIGURES" --zero-stage 2 \
    --lora-rows 32 --prompt 512 --response 512 --micro 8
if "$PY" -c 'import vllm, psutil' 2>/dev/null; then
    step "weight sync to vLLM"
    run_limited "weight sync" 150 "$PY" bench/weight_sync.py --sizes 100m --pairs 2 \
        2>&1 | tee /tmp/ppoflow-weight-sync.log
    report "" "Weight sync (bench/weight_sync.py, 100.9M parameters, actor on the GPU):" '```' \
        "$(grep -E '^ *(model|100m|  ) |after ÷ before|load average' /tmp/ppoflow-weight-sync.log)" '```'
fi
report "" "$(grep -v 'peak_tflops=' "$FIGURES")" "" "Total wall time: ${SECONDS}s (budget ${BUDGET}s)."
rm -f "$FIGURES"

step "report ($REPORT)"
cat "$REPORT"
