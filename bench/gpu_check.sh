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
# 3. trains (bench/gpu_train.py): `ppoflow train`, GRPO with a KL loss on a random-init
#    Qwen2.5-0.5B-shaped model for 2 steps ending with a checkpoint, then `ppoflow resume` for 2
#    more; per-stage seconds, tokens/s, peak memory and the update's MFU from the run's journals;
# 4. runs `pytest -m gpu tests/engines/test_gpu.py` (DeepSpeed bf16 / ZeRO-3 on CUDA, bf16 vs fp32
#    log-probs, HF rollouts, micro-batch split invariance in fp32 ZeRO-2, the actor worker and its
#    MFU / memory metrics), and tests/engines/test_rollout_vllm.py (all but `slow`, gpu ones
#    included) when vllm imports;
# 5. measures the GPU figures (bench/gpu_check.py): peak bf16 matmul, actor-update MFU at
#    Qwen2.5-0.5B's shape with padded and with packed rows (6·N·tokens/s and verl's estimate, ÷
#    peak), HF rollout tokens/s (`generate` and the CUDA-graph decode) and, when vllm imports,
#    vLLM's, LoRA rank 8 / 64
#    against full training (step time, peak memory, optimizer state; a Qwen2.5-0.5B-shaped
#    model built from a config), and the actor → vLLM weight sync's time and host memory
#    (bench/weight_sync.py, 100M parameters);
# 6. writes a short report to $OUT/gpu_report.md (./gpu_report.md when OUT is unset) and the whole
#    log to gpu_check.log beside it.
# Every step has a time limit inside an overall budget (PPOFLOW_GPU_BUDGET_S, default 470 s); a step
# that fails is recorded in the report and the next one runs.
#
# Wheels. The CUDA image has python3 (3.12) with torch, transformers, numpy, pytest, pyyaml,
# pyarrow, safetensors, tensorboard, … but none of Prefect, DeepSpeed, tensordict, pydantic or the
# config loader's omegaconf / hydra-core. bench/gpu_wheels.txt names every package to carry (what
# ppoflow needs and the image lacks: the closure of its requirements, MLflow and wandb left out);
# fill bench/wheels on the CPU machine (network access, the project's .venv) with
#
#     bash bench/gpu_check.sh --fetch-wheels
#
# which pins each to the version installed in .venv, downloads the wheels for CPython 3.12 on
# manylinux x86-64 (`pip download --no-deps --only-binary=:all: --python-version 3.12 …`) and
# builds the pure-Python wheels of the two sdists (deepspeed with .venv's torch; its CUDA ops are
# JIT-compiled on the GPU machine). The device tool carries at most 64 MiB, the repository
# included: the fetch fails above WHEEL_LIMIT_MIB. bench/wheels is git-ignored (.gitignore line:
# bench/wheels/), so name it in the tool's carry list. PPOFLOW_WHEEL_PYTHON (default 3.12) is the
# GPU python's version. vllm is far too large to carry; its checks run only where the image
# already has it. PPOFLOW_WHEEL_DIR overrides the wheel folder (both modes).
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
mapfile -t WHEEL_PACKAGES < <(grep -v '^#' bench/gpu_wheels.txt | grep .)
SDIST_PACKAGES=(deepspeed antlr4-python3-runtime)
WHEEL_DIR=${PPOFLOW_WHEEL_DIR:-bench/wheels}
WHEEL_LIMIT_MIB=54

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
    ls "$WHEEL_DIR"
    local mib
    mib=$(du -sm "$WHEEL_DIR" | cut -f1)
    echo "bench/wheels: ${mib} MiB (limit ${WHEEL_LIMIT_MIB} MiB: the device tool carries 64 MiB with the repository)"
    if ((mib > WHEEL_LIMIT_MIB)); then
        echo "gpu_check: the wheels take ${mib} MiB, over ${WHEEL_LIMIT_MIB}; remove stale ones from $WHEEL_DIR" >&2
        return 1
    fi
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
names = ["deepspeed", "transformers", "tensordict", "pydantic", "prefect", "omegaconf", "hydra-core", "peft", "vllm", "pytest"]
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
print(" | ".join(f"{name} {version(name)}" for name in names))
EOF
report '```' ""

step "imports"
if "$PY" -c 'import deepspeed, tensordict, pydantic, transformers, pytest, prefect
import dataproto, stages.engines.actor, stages.engines.rollout_hf, stages.config, flows.cli.app'; then
    step "training: ppoflow train + resume (bench/gpu_train.py)"
    TRAIN_REPORT=$OUT_DIR/.gpu_train.md
    : >"$TRAIN_REPORT"
    run_limited "training (ppoflow train + resume)" 200 \
        "$PY" bench/gpu_train.py --report "$TRAIN_REPORT" --timeout 95
    cat "$TRAIN_REPORT" >>"$REPORT"
    rm -f "$TRAIN_REPORT"
    report "" "## Tests"
    step "pytest -m gpu tests/engines/test_gpu.py"
    run_limited "tests/engines/test_gpu.py (-m gpu)" 75 \
        "$PY" -m pytest -m gpu tests/engines/test_gpu.py -p no:cacheprovider -q -rfE \
        2>&1 | tee /tmp/ppoflow-pytest-gpu.log
    report '```' "$(grep -E '^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped|error)' /tmp/ppoflow-pytest-gpu.log | tail -20)" '```'
else
    report "- imports failed (deepspeed / tensordict / pydantic / prefect / ppoflow): see gpu_check.log; training and tests not run"
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
run_limited "peak" 30 "$PY" bench/gpu_check.py peak --report "$FIGURES"
peak=$(sed -n 's/.*peak_tflops=\([0-9.]*\).*/\1/p' "$FIGURES" | tail -1)
step "actor update MFU"
run_limited "mfu" 60 "$PY" bench/gpu_check.py mfu --report "$FIGURES" --peak-tflops "${peak:-788}" \
    --zero-stage 2 --rows 64 --prompt 512 --response 512 --micro 16
step "rollout tokens/s"
run_limited "rollout" 90 "$PY" bench/gpu_check.py rollout --report "$FIGURES" \
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
