# gpu-rebalancer container image.
#
#   make image        (docker build --build-arg VERSION=<pyproject.toml's version> -t gpu-rebalancer:<it> .)
#
# The version has one home, pyproject.toml: the build needs it as --build-arg VERSION and stops when
# the two differ, so no image is ever labelled with another version than the code it holds.
#
# Stage 1 (python slim) installs every runtime dependency from the lock file, each one checked against
# its hash, and the project itself, into /app. Stage 2 is distroless Python: the same Debian 12 (glibc
# 2.36) and Python 3.11 the wheels were installed for, and nothing else: no shell, no pip, no apt. It
# runs as an unprivileged numeric user and writes nothing, so it runs with `readOnlyRootFilesystem: true`.
#
# Both bases are pinned by digest. To move to a newer build of a tag, look its digest up
# (`docker buildx imagetools inspect <tag>`) and change only the *_DIGEST line, or pass
# `--build-arg BUILD_DIGEST=sha256:...`.

ARG BUILD_BASE=docker.io/library/python:3.11-slim-bookworm
ARG BUILD_DIGEST=sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91
ARG RUNTIME_BASE=gcr.io/distroless/python3-debian12:nonroot
ARG RUNTIME_DIGEST=sha256:7d1042ce588ab97019fe95c24ffca7bc5a82ccdac572511d5e09bda4435c89c5

FROM ${BUILD_BASE}@${BUILD_DIGEST} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY requirements/ requirements/
# The build backend, then the dependencies into /app: wheels only (no compiler here), every file
# checked against the lock's hashes, nothing resolved beyond the lock.
RUN pip install --no-cache-dir --require-hashes -r requirements/build.txt \
 && pip install --no-cache-dir --require-hashes --only-binary=:all: --target /app -r requirements/runtime.txt

COPY pyproject.toml README.md ./
ARG VERSION
RUN python -c "import sys, tomllib; v = tomllib.load(open('pyproject.toml', 'rb'))['project']['version']; \
sys.exit(None if sys.argv[1] == v else f'--build-arg VERSION={sys.argv[1]!r}: pyproject.toml says {v} (make image)')" \
    "${VERSION}"
COPY rebalancer/ rebalancer/
COPY strategies/ strategies/
# The project, with the locked build backend (no build isolation: nothing fetched unpinned). pip compiles
# the bytecode here, once; console scripts would point at this stage's interpreter, so they go.
RUN pip install --no-cache-dir --no-deps --no-build-isolation --target /app . \
 && rm -rf /app/bin


FROM ${RUNTIME_BASE}@${RUNTIME_DIGEST}

ARG VERSION
ARG REVISION=unknown
ARG RUNTIME_BASE
ARG RUNTIME_DIGEST

LABEL org.opencontainers.image.title="gpu-rebalancer" \
      org.opencontainers.image.description="A descheduler for GPU clusters: consolidate GPU nodes, reclaim idle GPUs, repair GPU affinity and topology skew." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${RUNTIME_BASE}" \
      org.opencontainers.image.base.digest="${RUNTIME_DIGEST}"

# The installed project and its dependencies, owned by root and read-only to the user. No .pyc written
# next to the code (the root filesystem is read-only), unbuffered logs.
COPY --from=build /app /app
ENV PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Unprivileged, numeric (so `runAsNonRoot` can verify it without /etc/passwd), no home directory.
USER 65532:65532
WORKDIR /

# Metrics and health (/metrics, /healthz, /readyz).
EXPOSE 8080

# No shell and no PATH lookup in the image: the interpreter by its absolute path.
ENTRYPOINT ["/usr/bin/python3", "-m", "rebalancer"]
CMD ["run", "--policy", "/etc/gpu-rebalancer/policy.yaml"]
