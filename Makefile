# Two entry points matter: `make run` and `make test` (see README.md).
# Everything else is a prerequisite they pull in, so a fresh clone needs nothing by hand.
# Any Python >= 3.11 the machine has, newest first; `make PYTHON=/path/to/python` picks one by hand.
PYTHON_OK := import sys; sys.exit(sys.version_info < (3, 11))
ifeq ($(origin PYTHON),undefined)
PYTHON := $(firstword $(foreach p,python3.13 python3.12 python3.11 python3,$(shell $(p) -c '$(PYTHON_OK)' >/dev/null 2>&1 && command -v $(p))))
endif
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export KPMON_HOME ?= $(CURDIR)/.kpmon

.PHONY: setup jars tools debian-tools native tapcore schemas lint typecheck test unit run clean

# Four jobs: the set-up steps need nothing from each other but the venv, and lint and typecheck only
# the venv, so pip, apt and the jar downloads (network waits, and a Maven start per jar) overlap
# with the Go build, mypyc and mypy on a 2-core machine. Not with `clean` among the goals,
# which must not run beside what it removes.
ifeq ($(filter clean,$(MAKECMDGOALS)),)
MAKEFLAGS += -j4
endif

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.11 found (tried python3.13, python3.12, python3.11, python3); install one or set PYTHON=/path/to/python"; exit 1; }
	@$(PYTHON) -c '$(PYTHON_OK)' 2>/dev/null || { echo "error: $(PYTHON) is not a Python >= 3.11 (found: $$($(PYTHON) --version 2>&1))"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# Wheels only: a dependency whose newest release has no wheel for this Python resolves to an older
	@# one that has, instead of compiling for minutes. pyspark is published only as a source archive,
	@# with no code to compile (Python and jars).
	$(PY) -m pip install -q --only-binary=:all: --no-binary=pyspark -e '.[all,dev,bench,ops]'
	touch $(STAMP)

setup: $(STAMP) jars tools debian-tools native tapcore

# The per-frame cores compiled by mypyc from their own source (codec/native.py, docs/decisions.md).
# Rebuilt when a source of their packages changes; codec/native.py also refuses a stale build at
# import. `KPMON_NATIVE=0 make setup` skips it (everything then runs as plain Python).
NATIVE := build/native/manifest.json
PURE_TESTS := tests/checks tests/streaming/test_stages.py tests/streaming/test_bundles.py tests/codec/test_taprecord.py tests/codec/test_facts.py tests/codec/test_native.py tests/codec/test_records.py tests/codec/test_plans.py
native: $(NATIVE)
$(NATIVE): $(STAMP) $(wildcard codec/*.py checks/*.py checks/rules/*.py streaming/stages.py streaming/router.py streaming/rows.py streaming/frames.py deploy/native.py)
	$(PY) -m deploy.native

# The tap's native core (tap/native, Rust: docs/tap.md), built with maturin and installed into the venv;
# rebuilt when its sources change (tap.native_core also refuses a build older than its source).
# rustup installs cargo in ~/.cargo/bin, which a CI shell's PATH often lacks. Without cargo the set-up
# goes on and the tap runs its Python reference core; `KPMON_NATIVE=0 make setup` skips it too.
CARGO ?= $(firstword $(shell command -v cargo) $(wildcard $(HOME)/.cargo/bin/cargo))
TAPCORE := build/tapcore/installed
tapcore: $(TAPCORE)
$(TAPCORE): $(STAMP) $(wildcard tap/native/*.toml tap/native/Cargo.lock tap/native/*.pyi tap/native/src/*.rs) deploy/tapcore.py
	KPMON_CARGO=$(CARGO) $(PY) -m deploy.tapcore

# From Debian's packages, once: tcpdump captures real client<->broker traffic for the pcap tests;
# tshark dissects what `kpmon export --pcap` writes (docs/quickstart.md); promtool (package prometheus)
# checks and unit-tests the alerting rules for kpmon itself (deploy/prometheus, docs/operations.md);
# a real Alertmanager (prometheus-alertmanager) receives the alertmanager hook's payloads in the tests
# (docs/alerting.md). Prebuilt, they install in seconds, where a Go build of promtool or Alertmanager
# takes minutes of both cores. No recommends: prometheus would pull in a node exporter daemon.
DEBIAN_TOOLS := tcpdump tshark promtool prometheus-alertmanager
debian-tools:
	@for tool in $(DEBIAN_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		echo "kpmon: installing tcpdump, tshark, prometheus (for promtool) and prometheus-alertmanager (Debian packages)"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			tcpdump tshark prometheus prometheus-alertmanager; \
	fi

# kubeconform validates the Kubernetes manifests (deploy/k8s); built once from the Go module proxy
# (about a minute: neither Debian nor PyPI has a build of it).
KUBECONFORM := $(KPMON_HOME)/bin/kubeconform
tools: $(KUBECONFORM)
$(KUBECONFORM):
	@if command -v go >/dev/null; then \
		echo "kpmon: building kubeconform v0.7.0 (once)"; \
		GOBIN=$(KPMON_HOME)/bin go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0; \
	else echo "kpmon: go not found: manifest schema checks will be skipped (docs/cluster-mode.md)"; fi

# Kafka jars (client definitions for the codec, brokers for the local stack) and the YARN daemons of the
# YARN tests (deploy/yarn.py) from Maven Central, cached.
jars: $(STAMP)
	$(PY) -m deploy.fetch

# Regenerate codec/schema_table.json (and the lists derived from the jars) from the pinned Kafka jars.
schemas: jars
	jars=$$($(PY) -m deploy.fetch --clients-jars) && $(PY) -m codec.generator --write $$jars
	$(PY) -m codec.protocol_gen --write
	$(PY) -m deploy.password_configs_gen --write

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The suite on both cores (pytest-xdist), a test file at a time per worker, so that a file's module
# fixtures (a Spark session, a secured stack) start once. Each worker starts the session fixtures it
# needs for itself (a Kafka stack is a JVM of its own, in a fresh directory on kernel-chosen ports).
XDIST := -n 2 --dist loadfile

unit: setup
	$(PY) -m pytest -m "not integration" -q $(XDIST)

test: setup lint typecheck
	@# The tap core's pieces in Rust alone, without Python (seconds), where cargo is.
	@if [ -n "$(CARGO)" ]; then PATH="$(dir $(CARGO)):$$PATH" CARGO_TARGET_DIR=build/tapcore/target \
		$(CARGO) test -q --locked --no-default-features --manifest-path tap/native/Cargo.toml; fi
	@# The slowest tests are listed at the end: what to look at first when the suite's time grows.
	$(PY) -m pytest -q $(XDIST) --durations=15
	@# The plain-Python fallback of the compiled cores passes the cores' own tests too.
	KPMON_NATIVE=0 $(PY) -m pytest -q $(XDIST) -m "not integration" $(PURE_TESTS)

run: setup
	$(VENV)/bin/kpmon run

clean:
	rm -rf $(VENV) build/native build/tapcore .mypy_cache .ruff_cache .pytest_cache
