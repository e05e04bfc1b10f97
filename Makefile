# One entry point for people and CI. `make demo` runs the main job, `make test` the tests;
# both create the virtual environment on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo plans test lint typecheck unit e2e control-plane prometheus helm images images-check system-packages bench-operator bench-router bench-emulator bench-advisor crds calibration clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: the capacity plan of every example, then the live local fleet: an autoscaled
# service, the built-in chat load through its router, the fleet scaling as it happens
# (`inferfleet demo --trace FILE` replays a production trace instead).
demo: plans control-plane prometheus
	$(BIN)/inferfleet demo

plans: $(STAMP)
	@# Exit status 3 means "planned, and it does not fit or misses the SLO": expected for one example.
	@for f in examples/*.yaml; do \
	  echo "== inferfleet plan -f $$f"; \
	  $(BIN)/inferfleet plan -f $$f; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 3 ] || exit $$rc; echo; \
	done

test: lint typecheck unit e2e

lint: $(STAMP)
	$(BIN)/ruff check operator tests benchmarks
	$(BIN)/ruff format --check operator tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The unit tier lints and templates the chart with a real helm and runs the Argo CD health
# checks under Lua 5.1; promtool comes with the first rules test.
unit: $(STAMP) system-packages helm
	$(BIN)/pytest

# Builds kube-apiserver, controller manager, scheduler, kubectl, kwok and etcd from their Go
# modules once; later runs reuse the cache outside the work tree.
control-plane:
	bash tools/devcluster/build.sh

# Prometheus from Debian's package at a pinned version, unpacked once into a cache; and, for
# the local fleet's pod discovery (which Debian's lacks), one built once from its Go module.
prometheus:
	bash tools/prometheus/fetch.sh
	bash tools/prometheus/build-kubernetes-sd.sh

e2e: $(STAMP) system-packages control-plane prometheus helm images
	$(BIN)/pytest tests/e2e

# Debian packages of the tests and the local fleet (Lua 5.1, crun, umoci, the image tools),
# installed with apt-get when missing.
system-packages:
	bash tools/system-packages.sh

# helm from its Go module at the version pinned in tools/helm/go.mod, built once and cached.
helm:
	bash tools/helm/build.sh

# The operator, router and sim-engine images, built once from runtime_images/ with no base
# image from a registry (a Debian root filesystem plus the locked wheels); needs root. Later
# runs reuse the cache. `tools/images/push.sh REGISTRY` pushes them.
images: $(STAMP) system-packages
	bash tools/images/build.sh

# The built images run through crun as a kubelet would: non-root, read-only root, serving.
images-check: images
	bash tools/images/smoke.sh

# Performance, kept out of the tests: 1,000 InferenceServices applied at once on the dev cluster,
# against the same engine Deployments applied bare.
bench-operator: $(STAMP) control-plane
	$(BIN)/python -m benchmarks.operator_scale

# The data plane: router overhead against direct-to-engine at 100, 500 and 1000 streams.
bench-router: $(STAMP)
	$(BIN)/python -m benchmarks.router_overhead

# The engine emulator: streams per core before its timing distorts, and TTFT/TPOT against the
# planner's prediction.
bench-emulator: $(STAMP)
	$(BIN)/python -m benchmarks.emulator_capacity
	$(BIN)/python -m benchmarks.emulator_fidelity

# The advisor: how long `plan --recommend` searches its default space, per example.
bench-advisor: $(STAMP)
	$(BIN)/python -m benchmarks.advisor

crds: $(STAMP)
	$(BIN)/inferfleet crds

calibration: $(STAMP)
	$(BIN)/inferfleet calibrate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
