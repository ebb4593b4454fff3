# Set-up and entry points of the course. Everything lands in $(VENV); nothing is installed elsewhere,
# except Debian's slurm/munge/fashion-mnist packages that `make test` adds when run as root (CI).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel; a site that provides PyTorch sets SITE_TORCH=1 instead (see README).
TORCH ?= torch==2.13.0
SITE_TORCH ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# what the tests and the linter need on top of a learner's install (the test extra: pytest, playwright, nbgrader,
# ruff, py-spy); `make lab` never installs it
TEST_STAMP := $(VENV)/.installed-test
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
LAB_ARGS ?=

.PHONY: lab test test-fast lint notebooks venv kernel clean shared-install hub-test-install

# JupyterLab on this folder, opened on notebook 00. A clone is its own workspace (COURSE_WORKSPACE): the kernels
# write runs and outputs to its jobs/runs/ and out/. $(LAB_DIR), which git ignores, is this lab's Jupyter config
# folder (the user's ~/.jupyter is still read, below it): no news prompt, no nbgrader or Extension Manager for
# learners, terminals with the venv's bin first on PATH, the notebooks signed (they open trusted), the clone's
# scaffolding out of the file browser; nothing is written to ~/.jupyter or into the venv. It installs the lab extra
# only: the test extra (pytest, playwright, nbgrader, ruff, py-spy) is make test's.
# LAB_ARGS: more options for jupyter lab, e.g. LAB_ARGS=--port=8890.
LAB_DIR := $(CURDIR)/.course/lab
LAB_OPEN := /lab/tree/notebooks/00_welcome.ipynb
lab: $(STAMP)
	@$(VENV)/bin/course write lab-settings --lab-dir $(LAB_DIR) --trust notebooks >/dev/null
	@echo "make lab: open the address JupyterLab prints below (http://127.0.0.1:PORT$(LAB_OPEN)?token=...)"
	COURSE_WORKSPACE=$(CURDIR) PATH="$(abspath $(VENV))/bin:$$PATH" \
	JUPYTER_CONFIG_PATH="$${JUPYTER_CONFIG_DIR:-$$HOME/.jupyter}$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	JUPYTER_CONFIG_DIR=$(LAB_DIR) $(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser $(ROOT_FLAG) \
		--ServerApp.root_dir=$(CURDIR) --LabApp.default_url=$(LAB_OPEN) $(LAB_ARGS)

# Four workers on 2 cores: the Slurm tests share one worker (conftest) and mostly wait on the scheduler, and for
# the first minutes two more wait on the hub's browser and the two-node cluster; the others fill those waits.
# The run is CPU-bound at any count measured (fresh clones of one commit, each with a /proc sampler beside it):
# 3 workers 1069 s, 4 workers 1073 s, 6 workers 1152 s with the cores 0 % idle from the first minute on.
PYTEST_WORKERS ?= 4
# The system packages and the hub's shared install need neither the venv nor each other's CPU much: they are made
# while the venv is built (on a fresh CI machine about a minute each, one after the other before), their output
# shown when both are done. A failure in them only makes the tests that need them skip, saying why.
DEPS_LOG := out/test-deps.log
test:
	@mkdir -p out; { bash scripts/system-deps.sh; $(MAKE) --no-print-directory hub-test-install; } >$(DEPS_LOG) 2>&1 & \
	deps=$$!; $(MAKE) --no-print-directory $(STAMP) lint; rc=$$?; wait $$deps; cat $(DEPS_LOG); exit $$rc
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

# The unit tests alone, each under a second: no multi-process, notebook or Slurm run, and no test that took a second
# or more in the run tests/durations.json keeps (tests/conftest.py marks those slow). About 20 s on an idle 2-core
# machine; `make test` runs everything.
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -m "not slow and not slurm" -n 2 -q

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

notebooks: $(STAMP)
	$(VENV)/bin/course run notebooks

venv: $(STAMP)

# A named Jupyter kernel for JupyterHub users (it shows up as "Multi-GPU course" in the launcher).
kernel: $(STAMP)
	$(PY) -m ipykernel install --user --name multigpu-course --display-name "Multi-GPU course"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(if $(SITE_TORCH),--system-site-packages) $(VENV)
	$(if $(SITE_TORCH),$(PYTHON) -m course_lib.selftest.pick --see-site $(PY) $(PYTHON))
	$(if $(SITE_TORCH),$(PY) -m course_lib.selftest.pick $(PY) >/dev/null)
	$(if $(SITE_TORCH),$(PY) -c 'import torch; print("using the site PyTorch", torch.__version__)')
	$(if $(SITE_TORCH),COURSE_PIP=1) bash scripts/venv-install.sh $(PY) $(if $(SITE_TORCH),,"$(TORCH)") -e ".[lab]"
	@$(PY) -c 'import torch, course_lib; print("torch", torch.__version__, "| course_lib ready")'
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(if $(SITE_TORCH),COURSE_PIP=1) bash scripts/venv-install.sh $(PY) -e ".[lab,test]"
	touch $(TEST_STAMP)

# One install for every user of a JupyterHub (docs/jupyterhub.md): PREFIX/course read-only, PREFIX/venv from
# a Python every user can run, the "Multi-GPU course" kernel under /usr/local, learners' JupyterLab settings.
PREFIX ?= /opt/multigpu-course
SITE ?= generic
shared-install:
	SITE=$(SITE) bash scripts/hub/shared-install.sh $(PREFIX)

# The shared install the hub tests use (tests/test_hub.py), with the npm proxy; fast when up to date.
# Only as root (the hub starts servers as other users); otherwise the hub tests skip and say why.
HUB_TEST_PREFIX ?= /opt/multigpu-course-test
hub-test-install:
	@if [ "$$(id -u)" = 0 ]; then HUB_PROXY=1 KERNEL_PREFIX=$(HUB_TEST_PREFIX)/venv bash scripts/hub/shared-install.sh \
		$(HUB_TEST_PREFIX) || echo "[hub-test-install] failed: the hub tests will skip"; \
	else echo "[hub-test-install] not root: the hub tests will skip"; fi

clean:
	rm -rf $(VENV) out jobs/runs

# The GPU self-check (docs/gpu-check.md): every GPU path of the course, a report in out/gpu-check/. It runs with
# GPU_CHECK_PYTHON if set, else the first of the finished venv's python and $(PYTHON) whose torch has CUDA when
# nvidia-smi lists a GPU (none: stop, exit 2), else the first of them; nothing re-installs torch.
# Its exit codes: 0 every item that could run passed, 1 one FAILed, 2 bad input, 3 a --require item did not pass.
.PHONY: gpu-check gpu-wheels
GPU_CHECK_PYTHON ?=
GPU_CHECK_ARGS ?=
gpu-check:
	@py="$(GPU_CHECK_PYTHON)"; [ -n "$$py" ] || py=$$($(PYTHON) -m course_lib.selftest.pick \
		$(if $(wildcard $(STAMP)),$(PY)) $(PYTHON)) || exit 2; \
	echo "gpu-check with $$py"; "$$py" -m course_lib selftest gpu $(GPU_CHECK_ARGS)

# The packages the GPU machine lacks, as wheels for its Python (GPU_PYTHON, default 3.12), in out/gpu-wheels/.
gpu-wheels:
	bash scripts/gpu-wheels.sh
