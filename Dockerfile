# syntax=docker/dockerfile:1
# gpu-admission: the admission webhook server and its CLI.
#   docker build -t ghcr.io/example/gpu-admission:0.1.0 .
# Both stages use the same base image, so the virtualenv built in the first one (whose
# interpreter is /usr/local/bin/python3.11) runs unchanged in the second.

# ---- builder: the locked dependencies and the project's wheel, installed into a venv ----
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the image is built from (see .dockerignore): the locks first, so the layer of
# dependencies is rebuilt only when a lock changes.
COPY requirements.lock build-requirements.lock ./
# The dependencies exactly as `make lock` pinned them: every file checked against the lock's
# sha256 (two builds of one tag install the same bytes), nothing resolved (--no-deps), and
# wheels only (each pinned release ships them for both platforms, so no compiler is needed).
# The venv has no pip: the builder's pip installs into it.
# The tools that build the project's wheel (setuptools, wheel) likewise, into the builder's own
# Python: the wheel is built without build isolation, which would fetch the newest ones.
RUN python -m venv --without-pip /opt/venv \
 && pip --python /opt/venv/bin/python install --require-hashes --no-deps --only-binary :all: \
        -r requirements.lock \
 && pip install --require-hashes --no-deps --only-binary :all: -r build-requirements.lock
COPY pyproject.toml ./
COPY webhook ./webhook
# The project's wheel, installed without its dependencies (the lock brought them); pip check
# fails the build if the lock misses one that pyproject.toml or a locked package requires.
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && pip --python /opt/venv/bin/python install --no-deps --no-index --find-links /wheels \
        gpu-admission \
 && pip --python /opt/venv/bin/python check

# ---- runtime: no build tools, no pip in the venv, non-root ----
FROM python:3.11-slim AS runtime
# The release workflow passes pyproject.toml's version; the wheel inside has it already.
ARG VERSION=dev
LABEL org.opencontainers.image.title="gpu-admission" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Kubernetes admission webhook for GPU Pods" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
COPY --from=builder /opt/venv /opt/venv
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd; the
# manifests run it as 10001 as well, with a read-only root filesystem.
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["gpu-admission"]
CMD ["serve"]
