# Two commands do all set-up on a fresh machine with Python 3.11 and the package registries:
#   make demo   -- the main job on the embedded default (WMRL on the synthetic domain) + report
#   make test   -- the test suite
# torch is pinned in every install command: an unpinned torch pulls a multi-GB CUDA build.

PYTHON ?= python3.11
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.wmrl-installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE  ?= 1

.PHONY: install demo demo-autoresearch test bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[dev,autoresearch]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wmrl train synthetic-program
	$(VENV)/bin/wmrl bench modes trainer.eval_every=20

# the AutoResearch main job (in progress, issue 3): builds the embedded agent on first use (~4 min)
demo-autoresearch: $(STAMP)
	$(VENV)/bin/wmrl train autoresearch

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/wmrl bench modes

clean:
	rm -rf $(VENV) runs bench/out
