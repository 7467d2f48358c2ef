# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8443

.PHONY: run test lint bench install certs clean sync-data

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

certs/tls.crt: | $(STAMP)
	$(BIN)/gpu-admission certs generate --service gpu-admission --namespace gpu-admission \
		--host 127.0.0.1 --host localhost --out certs

certs: certs/tls.crt

run: $(STAMP) certs/tls.crt
	@echo "Try it from another shell:"
	@echo "  curl --cacert certs/ca.crt -H 'Content-Type: application/json' \\"
	@echo "       --data @tests/fixtures/admission-review-gpu-pod.json https://127.0.0.1:$(PORT)/validate"
	$(BIN)/gpu-admission serve --policy policies/default.yaml --cert certs/tls.crt --key certs/tls.key \
		--bind 127.0.0.1:$(PORT)

test: $(STAMP)
	@command -v kubectl >/dev/null || { echo "make test needs kubectl (kustomize rendering and JSON Patch checks): install it first"; exit 1; }
	$(BIN)/ruff check webhook tests tools
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
