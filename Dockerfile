# syntax=docker/dockerfile:1
# outlive and the inventory demo on Debian 12, from Debian packages only (the same ones as
# scripts/install-deps.sh). Used by compose.yaml for the replicas, `migrate` and the demo app:
#   docker compose up --build
# The image has no entrypoint: the command names the program (outlive or inventory_demo).

# ---- build: cmake and the -dev packages -------------------------------------------------------
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      libpqxx-dev libpq-dev libnats-dev \
      libssl-dev liburing-dev \
      libboost-dev libboost-system-dev nlohmann-json3-dev libvalijson-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -DBUILD_TESTING=OFF \
 && cmake --build build --target outlive inventory_demo -j"$(nproc)"
# What the runtime stage takes: stripped binaries; the demo's page (examples/inventory/web) and the
# browser client; schemas/ for the event schemas the configurations name.
RUN install -D -s -m 0755 build/src/app/outlive /out/bin/outlive \
 && install -D -s -m 0755 build/examples/inventory/inventory_demo /out/bin/inventory_demo \
 && mkdir -p /out/web /out/clients \
 && cp -R examples/inventory/web/. /out/web/ \
 && cp clients/js/outlive.js /out/clients/outlive.js

# ---- runtime: the runtime libraries only ------------------------------------------------------
FROM debian:bookworm-slim
# curl is for the compose healthchecks (GET /readyz).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libpqxx-6.4 libnats3.4 libboost-system1.74.0 libssl3 libpq5 liburing2 \
      ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin outlive
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /src/schemas/ /opt/outlive/schemas/
COPY --from=build /out/web/ /opt/outlive/web/
COPY --from=build /out/clients/ /opt/outlive/clients/
USER outlive
WORKDIR /opt/outlive
EXPOSE 8080
CMD ["outlive", "serve", "--config", "/etc/outlive/outlive.json"]
