#!/usr/bin/env bash
# The README's run command: installs the dependencies, builds, and runs the inventory demo:
# PostgreSQL 15 and NATS JetStream (in .outlive-dev/, kept between runs), two outlive replicas, the
# demo app and nginx as the gateway on http://localhost:8080/. Ctrl-C stops everything.
# Arguments go to outlive_demo_run, e.g. `scripts/run.sh --port 9090`, `scripts/run.sh --check`,
# `scripts/run.sh --gateway haproxy` or `scripts/run.sh --auth jwt` (the sockets sign in with JWTs
# that the demo app signs; examples/inventory/README.md), or `scripts/run.sh --app-server ts` (the
# app is the TypeScript server of examples/inventory-ts, its channels hooks it answers).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the demo's packages (the tests' browsers, fuzzing and deployment tools are scripts/test.sh's).
deps=--demo
for a in "$@"; do
  [ "$a" = haproxy ] && deps=--demo-haproxy
  [ "$a" = ts ] && deps=--demo-ts
done
echo "==> checking packages (apt-get installs what is missing: $deps)"
scripts/install-deps.sh "$deps"
build_dir=${BUILD_DIR:-build}
echo "==> building outlive and the demo into $build_dir/ (the first build takes several minutes)"
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target outlive outlive_demo_run
echo "==> starting the demo (Ctrl-C stops everything)"
exec "$build_dir/examples/inventory/outlive_demo_run" "$@"
