# syntax=docker/dockerfile:1
# outlive and the inventory demo on Debian 12, from Debian packages only (the same ones as
# scripts/install-deps.sh). Used by compose.yaml for the replicas, `migrate` and the demo app
# (`docker compose up --build`) and by deploy/k8s/:
#   docker build -t outlive .
#   docker run outlive                                   # serve --config /etc/outlive/outlive.json
#   docker run outlive migrate --database postgresql://...
#   docker run --entrypoint inventory_demo outlive ...   # the demo app (compose sets entrypoint: [])
# Checked by the deploy:dockerfile test (tests/deploy/).

# ---- build: cmake and the -dev packages -------------------------------------------------------
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config \
      libpqxx-dev libpq-dev libnats-dev \
      libssl-dev liburing-dev \
      libboost-dev libboost-system-dev nlohmann-json3-dev libvalijson-dev prometheus-cpp-dev \
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
# curl is for the image's HEALTHCHECK and compose's healthchecks (GET /healthz, /readyz).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libpqxx-6.4 libnats3.4 libboost-system1.74.0 libssl3 libpq5 liburing2 \
      libprometheus-cpp-core1.0 \
      ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 outlive \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin outlive
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /src/schemas/ /opt/outlive/schemas/
COPY --from=build /out/web/ /opt/outlive/web/
COPY --from=build /out/clients/ /opt/outlive/clients/
# The configuration is mounted here (a ConfigMap, a compose volume); nothing in the image writes.
RUN mkdir -p /etc/outlive
# A non-root user with a fixed id, so Kubernetes' runAsNonRoot can verify it without a name lookup.
USER 10001:10001
WORKDIR /opt/outlive
EXPOSE 8080 9090
# /healthz answers at once from an io thread (never waits on Postgres or NATS), so it suits a
# liveness-style check; the port is the public listener's unless server.admin_listen moves the
# operations routes (then set OUTLIVE_HEALTHCHECK_URL, e.g. http://127.0.0.1:9090/healthz).
ENV OUTLIVE_HEALTHCHECK_URL=http://127.0.0.1:8080/healthz
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS -o /dev/null --max-time 2 "$OUTLIVE_HEALTHCHECK_URL" || exit 1
# SIGTERM closes every socket with 1012 and stops within 10 s: give it that (docker stop -t 15).
STOPSIGNAL SIGTERM
ENTRYPOINT ["outlive"]
CMD ["serve", "--config", "/etc/outlive/outlive.json"]
