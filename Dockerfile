# mcp-sidecar: the daemon alone (no test tools), installed with the README's bootstrap script.
# `--build-arg SIDECAR_EXTRAS=fleet` adds the fleet backends (asyncpg, obstore: PostgreSQL and
# S3-compatible storage), as compose.yaml's `fleet` profile does; the default installs neither.
FROM python:3.11-slim
ARG SIDECAR_EXTRAS=
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scripts ./scripts
COPY sidecar ./sidecar
COPY bridges ./bridges
COPY managed_store ./managed_store
COPY manifests ./manifests
RUN SIDECAR_EXTRAS="$SIDECAR_EXTRAS" scripts/bootstrap
ENV SIDECAR_STATE_DIR=/state SIDECAR_MANIFESTS=/manifests
VOLUME ["/state"]
EXPOSE 8765
# Inside a container the daemon must listen on all interfaces for the port mapping to reach
# it; the Host/Origin checks still only accept local names (plus the service name).
CMD [".venv/bin/sidecar", "serve", "--host", "0.0.0.0", "--port", "8765", "--allowed-host", "sidecar"]
