# The two entry points the README promises: `make demo` and `make test`. Both bootstrap .venv from the
# lock files (every package pinned, every file checked against its hash), then install the project
# itself without resolving anything: `make demo` only what the command needs (requirements/runtime.txt
# and the build backend, requirements/build.txt; the project as a plain install), `make test` the whole
# development tool chain (requirements/dev.txt, which holds runtime's pins; the project editable).
#
# `make lock` regenerates requirements/ after a change to the dependencies in pyproject.toml:
#   runtime.txt  the daemon's dependencies (the container image installs exactly these)
#   build.txt    the build backend (setuptools, wheel) for the image and for the editable install
#   dev.txt      runtime + test + dev tools, constrained to the versions of runtime.txt
# The files are for CPython 3.11 on Linux, the interpreter of the image and of CI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.runtime
LOCK_DIR := requirements
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --no-emit-index-url --no-emit-find-links

# The image's tag and label: pyproject.toml's version, its one home (the Dockerfile checks the two agree).
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
IMAGE ?= gpu-rebalancer
REVISION = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

.PHONY: demo test lint typecheck unit bench clean lock image

# pip compiles what it installs to bytecode, but not an editable install's sources: compileall does, so
# commands started from this tree (and bench/) do not compile ~130 modules at every start (0.1 s; a
# changed source is recompiled in memory, its stale bytecode never used).
$(STAMP): pyproject.toml $(LOCK_DIR)/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK_DIR)/dev.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q rebalancer strategies
	touch $(STAMP) $(RUNTIME_STAMP)

# The demo's light install: no test or lint tools. A plain (not editable) install of the project, which
# the demo only runs; `make test` replaces it with an editable one.
$(RUNTIME_STAMP): pyproject.toml $(LOCK_DIR)/runtime.txt $(LOCK_DIR)/build.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK_DIR)/runtime.txt -r $(LOCK_DIR)/build.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation .
	touch $(RUNTIME_STAMP)

# The dev extra names the project's own test extra; pip-compile writes that self-reference as an
# unhashed `gpu-rebalancer @ file://...` line, which the sed drops (the project is installed on its own).
lock: $(STAMP)
	$(PIP_COMPILE) --output-file $(LOCK_DIR)/runtime.txt pyproject.toml
	$(PIP_COMPILE) --all-build-deps --only-build-deps --output-file $(LOCK_DIR)/build.txt pyproject.toml
	$(PIP_COMPILE) --extra dev --constraint $(LOCK_DIR)/runtime.txt --output-file $(LOCK_DIR)/dev.txt \
		pyproject.toml
	sed -i -e '/^# WARNING: pip install will require the following package to be hashed\.$$/{N;d;}' \
		-e '/^gpu-rebalancer @ /{N;d;}' $(LOCK_DIR)/dev.txt
	touch $(STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/rebalancer once --snapshot examples/demo-cluster --policy examples/demo-cluster/policy.yaml

image:
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE):$(VERSION) .

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
