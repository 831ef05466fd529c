# gpu-rebalancer container image.
#
#   docker build -t gpu-rebalancer:0.1.0 .
#
# Stage 1 builds wheels (the project and every dependency); stage 2 installs them into a clean slim
# image with no compiler, no build backend and no source tree, and runs as an unprivileged numeric user.
# The image writes nothing at run time, so it runs with `readOnlyRootFilesystem: true`.

FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY rebalancer/ rebalancer/
COPY strategies/ strategies/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .


FROM python:3.11-slim-bookworm

ARG VERSION=0.1.0
ARG REVISION=unknown

LABEL org.opencontainers.image.title="gpu-rebalancer" \
      org.opencontainers.image.description="A descheduler for GPU clusters: consolidate GPU nodes, reclaim idle GPUs, repair GPU affinity and topology skew." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm"

# No .pyc written next to the code (the root filesystem is read-only), unbuffered logs, no pip or
# Python caches anywhere in the image.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Installed from the build stage's wheels only (no index, no compiler). The wheels are bind-mounted,
# so they do not end up in a layer; pip compiles the bytecode once, here, at build time.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "gpu-rebalancer==${VERSION}"

# Unprivileged, numeric (so `runAsNonRoot` can verify it without /etc/passwd), no home directory.
USER 65532:65532
WORKDIR /

# Metrics, health and the last report (/metrics, /healthz, /readyz, /report).
EXPOSE 8080

ENTRYPOINT ["rebalancer"]
CMD ["run", "--policy", "/etc/gpu-rebalancer/policy.yaml"]
