# Hulk: every target runs from a fresh clone. `make install` first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PYTHON  := $(BIN)/python
SHARED  ?= ../shared

.PHONY: install test test-fast check demo bench model lab lab-secure protos check-protos clean agent-requirements

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# Debian packages the tests use: the MQTT broker, ip/ping for the lab, systemd-analyze for the units,
	@# nft for the broker's shipped connection limits, chromium (headless) for the dashboard's test.
	@missing=""; \
	  [ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || missing="$$missing mosquitto mosquitto-clients"; \
	  command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing="$$missing iproute2"; \
	  command -v ping >/dev/null 2>&1 || [ -x /usr/bin/ping ] || missing="$$missing iputils-ping"; \
	  command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing="$$missing nftables"; \
	  command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  fi
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel on local disk; an unpinned torch would pull a multi-gigabyte CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[planner,dev]'
	# Byte-code for the project's own modules, as a non-editable install has: where
	# PYTHONDONTWRITEBYTECODE is set, every command would otherwise compile them afresh.
	$(BIN)/python -m compileall -q agent hulk planner >/dev/null
	touch $@

test: install
	$(BIN)/pytest -q

# The fast lane: pure and in-process tests, none that starts a process (marker `process`).
test-fast: install
	$(BIN)/pytest -q -m "not process and not slow"

demo: install
	$(BIN)/hulk-planner plan examples/jobs.yaml --fleet examples/fleets/asia-24.json --out out/plan.json --plot out/plan.png

bench: install
	$(PYTHON) -m bench.run --shared $(SHARED)

model: install
	$(BIN)/hulk-planner train --seed 7 --out planner/gnn/hulk-gnn.pt

lab: install
	$(PYTHON) -m lab.run

# The lab set up as deploy/INSTALL.md sets up a fleet: private CA, TLS, broker accounts, tokens.
lab-secure: install
	$(PYTHON) -m lab.run --secure

protos:
	$(PYTHON) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. protos/hulk/v1/hulk.proto

# Static checks, a minute: errors and unused names (ruff), the generated stubs, and the rules
# the tree keeps (the agent imports no torch/numpy/planner; how tests import and are marked).
check: install
	$(BIN)/ruff check agent hulk planner lab bench examples tests
	$(MAKE) check-protos
	$(BIN)/pytest -q -p no:cacheprovider tests/test_hygiene.py tests/agent/test_import_isolation.py

# The committed stubs are exactly what `make protos` writes.
check-protos: install
	$(BIN)/pytest -q -p no:cacheprovider tests/hulk/test_protos.py

clean:
	rm -rf out build *.egg-info

# The agent's pinned dependencies with their hashes (deploy/INSTALL.md installs them with
# --require-hashes). pip-tools runs from a throwaway venv: it is no dependency of the project.
agent-requirements:
	test -x build/piptools/bin/pip-compile || { $(PY) -m venv build/piptools && build/piptools/bin/pip install -q pip-tools; }
	cd deploy && PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= ../build/piptools/bin/pip-compile -q --generate-hashes \
	    --index-url https://pypi.org/simple --no-emit-index-url --strip-extras \
	    -o agent-requirements.txt agent-requirements.in
