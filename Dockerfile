# effectd as a container: `podman build -t effectd .` or `docker build -t effectd .`
#
# BASE can name any Debian-like image with Python 3.11 and its venv module
# (`make image-test` substitutes one made locally with debootstrap). Both
# stages use it, so the virtual environment built below runs on the same
# interpreter it was built for.
ARG BASE=python:3.11-slim

# --- build: wheels of the daemon and its client, pinned dependencies -------
FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY clients/python ./clients/python
# The client is built in the same resolve: the daemon pins effectd-client
# 0.1.0, which is that local directory, not a package from an index.
RUN python -m venv /opt/build \
 && /opt/build/bin/python -m pip wheel --no-cache-dir --disable-pip-version-check \
        --wheel-dir /wheels ./clients/python .

# --- run: the installed venv, no compilers, no sources, a fixed non-root user
FROM ${BASE}
LABEL org.opencontainers.image.title="effectd" \
      org.opencontainers.image.description="A sidecar daemon that decides, durably, what an AI agent may execute, retry or replay."

# A fixed uid/gid: the agent container beside it runs as the same uid to
# reach the 0600 socket, and volume ownership does not change between builds.
RUN groupadd --system --gid 10001 effectd \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /var/lib/effectd --shell /usr/sbin/nologin effectd \
 && install -d -m 0700 -o 10001 -g 10001 /var/lib/effectd /run/effectd

# Installed from the build stage's wheels only (--no-index): what runs is
# exactly what was resolved there. The wheels are bind-mounted, not copied,
# so they add no layer (RUN --mount: podman/buildah, or Docker's BuildKit, the
# default builder since Docker 23); pip itself is removed afterwards.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/effectd \
 && /opt/effectd/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
        --no-index --find-links /wheels effectd \
 && /opt/effectd/bin/python -m pip uninstall --yes --quiet pip setuptools \
 && /opt/effectd/bin/effectd --version

# The data directory and socket are the ones the daemon and `effectd ctl`
# pick up from the environment; --health-listen serves only grpc.health.v1
# (plaintext, no credentials) for orchestrators' probes. The daemon never
# forks, and says so to grpcio rather than rely on its changing default.
ENV PATH=/opt/effectd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GRPC_ENABLE_FORK_SUPPORT=false \
    EFFECTD_DATA_DIR=/var/lib/effectd \
    EFFECTD_SOCKET=/run/effectd/effectd.sock \
    EFFECTD_HEALTH_LISTEN=0.0.0.0:50052

USER 10001:10001
WORKDIR /var/lib/effectd
VOLUME /var/lib/effectd
EXPOSE 50052

# SIGTERM: health NOT_SERVING, stop accepting, in-flight calls finish within
# --grace, the store closes. The probe talks gRPC health over the socket.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["/opt/effectd/bin/python", "-m", "sidecar.probe", "--timeout", "3"]

# A volume without a ledger is refused unless the arguments say --init: the
# first `run` on a new volume passes it (docs/operations.md, section 1).
ENTRYPOINT ["effectd", "serve"]
