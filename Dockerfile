# syntax=docker/dockerfile:1
# gpu-admission: the admission webhook server and its CLI.
#   docker build -t ghcr.io/example/gpu-admission:0.1.0 .
# Both stages use the same base image, so the virtualenv built in the first one (whose
# interpreter is /usr/local/bin/python3.11) runs unchanged in the second.

# ---- builder: wheels for the project and its dependencies, installed into a venv ----
FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore).
COPY pyproject.toml ./
COPY webhook ./webhook
# The project wheel plus wheels of all its dependencies (all of which ship binary wheels,
# so no compiler is needed here either), then a venv without pip holding only those.
RUN pip wheel --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/venv \
 && pip --python /opt/venv/bin/python install --no-index --find-links /wheels gpu-admission

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
