# Newcomer entry points: `make demo` trains Pendulum-v1 through ROS 2 topics, `make test`
# runs the tests (learning tests bounded: minutes), `make test-learning` the learning tests
# at full length. Each sets up .venv first (once; again only when a requirements file or
# the package metadata changes).

VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# ros-rclpy wheels exist for CPython 3.11 and 3.12 only: prefer those when present.
PYTHON ?= $(firstword $(shell for p in python3.11 python3.12 python3; do command -v $$p; done))
PIP_VERSION := 26.3
SETUP_STAMP := $(VENV)/.unilab-setup-stamp
NATIVE_SOURCES := $(wildcard unilab_ros/rl/native/*.cpp unilab_ros/rl/native/CMakeLists.txt)
BENCH_STAMP := $(VENV)/.unilab-bench-stamp

# MLX's backend on Linux: cuda13 or cuda12 where an NVIDIA driver reports a CUDA version
# that runs it (nvidia-smi), the CPU elsewhere; MLX_BACKEND=cpu (or cuda12, cuda13) chooses.
# macOS needs no extra: mlx brings Metal. The version is requirements.txt's pin.
MLX_VERSION := $(shell sed -n 's/^mlx==\([0-9.]*\).*/\1/p' requirements.txt)
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' \
    | head -n 1)
MLX_BACKEND ?= $(if $(filter Darwin,$(shell uname -s)),,$(if $(filter-out 0 1 2 3 4 5 6 7 8 9 \
    10 11 12,$(CUDA_MAJOR)),cuda13,$(if $(filter 12,$(CUDA_MAJOR)),cuda12,cpu)))
MLX_REQUIREMENT := $(if $(MLX_BACKEND),'mlx[$(MLX_BACKEND)]==$(MLX_VERSION)')

# `pip install torch` on Linux fetches the CUDA build from PyPI; TORCH_PIP_ARGS passes
# extra pip options (e.g. a CPU-only index) to that one install.
TORCH_PIP_ARGS ?=

.PHONY: setup openblas native test test-learning demo bench lint clean distclean

# ROS 2's launch, launch_ros, launch_testing and the ros2 CLI are not on PyPI. Given a
# wheelhouse of them (e.g. ROS2_WHEELHOUSE=../shared/wheels/ros2-launch, whose README says
# how they were built), setup installs it (so does test, which sets up first) and the
# launch tests run for real; without one those tests skip and say so. Never
# `pip install launch`: an unrelated project.
ROS2_WHEELHOUSE ?=
LAUNCH_STAMP := $(VENV)/.unilab-launch-stamp

setup: $(SETUP_STAMP) $(if $(ROS2_WHEELHOUSE),$(LAUNCH_STAMP))

# pip's PEP 660 editable install ignores setup.cfg's [develop]/[install] script dirs
# (those steer colcon's `setup.py develop/install` into lib/unilab_ros), so the console
# scripts land in .venv/bin. COLCON_IGNORE keeps a workspace crawl out of the venv.
$(SETUP_STAMP): requirements.txt requirements-dev.txt requirements-deploy.txt setup.py setup.cfg \
    package.xml $(NATIVE_SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  echo 'Could not create $(VENV): install python3-venv (Debian/Ubuntu).'; exit 1; }
	$(PIP) install --upgrade pip==$(PIP_VERSION)
	$(PIP) install -r requirements-dev.txt $(MLX_REQUIREMENT)
	$(PIP) install --no-deps -e .
	@$(MAKE) --no-print-directory openblas
	@$(MAKE) --no-print-directory native
	touch $(VENV)/COLCON_IGNORE
	touch $@

# The mlx[cpu] wheel links a reference BLAS; the package loads Debian's OpenBLAS ahead of
# mlx when present (~35x faster matmuls).
openblas:
	@if [ "$$(uname -s)" != Linux ]; then exit 0; fi; \
	if dpkg-query -W -f='$${Status}' libopenblas0-pthread 2>/dev/null \
	    | grep -q 'ok installed'; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    libopenblas0-pthread; \
	else \
	  echo 'note: libopenblas0-pthread is not installed; MLX falls back to its reference'; \
	  echo '      BLAS (slow matmuls). Install it with: sudo apt-get install libopenblas0-pthread'; \
	fi

# The fused activations for MLX's CPU backend (Linux; skipped elsewhere). A failed build
# does not fail set-up: the activations then run on plain MLX ops, as the log says.
native:
	-$(PY) -m unilab_ros.rl.native

# The learning tests (marker `learning`) read UNILAB_LEARNING: `bounded` trains each for
# a few minutes and still fails when learning collapses; `full` trains the longer budgets
# and more seeds (half an hour and more on 2 cores). CI runs `make test` too (.ci/run):
# the same tests on every machine, whatever CI is set to.
test: setup
	UNILAB_LEARNING=bounded $(PY) -m pytest -q $(PYTEST_ARGS)

test-learning: setup
	UNILAB_LEARNING=full $(PY) -m pytest -q -m learning $(PYTEST_ARGS)

$(LAUNCH_STAMP): $(SETUP_STAMP)
	$(PIP) install --no-deps $(abspath $(ROS2_WHEELHOUSE))/*.whl
	touch $@

demo: setup
	$(VENV)/bin/sim_train $(DEMO_ARGS)

# Bench-only dependencies: PyTorch and rsl_rl as the reference implementation. rsl_rl,
# tensordict and tensorboard go in without their dependencies (GitPython, onnx and the
# rest serve logging and export, which the benchmarks do not touch); pyvers, cloudpickle
# and absl-py are what rsl_rl's PPO and storage need to import. Stable-Baselines3 is
# bench/learning.py's reference PPO: it needs gymnasium and numpy (requirements.txt),
# torch and cloudpickle (here); pandas serves only its monitor-file readers, unused here.
# bench/learning.py trains tasks x seeds for hours on a small machine: it runs last.
bench: setup $(BENCH_STAMP)
	$(PY) bench/ppo_update.py
	$(PY) bench/act_latency.py
	$(PY) bench/soak.py
	$(PY) bench/learning.py

# torch 2.13 needs setuptools>=77.0.3 and colcon-core 0.21 needs <80: pin one that fits
# both, or pip would upgrade setuptools past what colcon supports. The pins live in this
# file, so a changed Makefile re-runs the installs (a no-op for what is already there).
$(BENCH_STAMP): $(SETUP_STAMP) Makefile
	$(PIP) install $(TORCH_PIP_ARGS) torch==2.13.0 setuptools==79.0.1
	$(PIP) install --no-deps rsl-rl-lib==5.5.1 tensordict==0.15.3 tensorboard==2.21.0 \
	  pyvers==0.2.3 cloudpickle==3.1.3 absl-py==2.5.1 stable-baselines3==2.9.2
	touch $@

lint: setup
	$(PY) -m ruff check .

clean:
	rm -rf build install log .pytest_cache .ruff_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) unilab_ros/rl/native/_unilab_native*.so
