#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12 packages. Idempotent and quiet when
# everything is already there.
set -euo pipefail
# `--demo`: only what building and running the demo needs (scripts/run.sh); without it, everything
# the tests need as well (browsers, fuzzing, deployment checks, Node.js).
demo=(
  build-essential cmake pkg-config ccache git
  libpqxx-dev libpq-dev libnats-dev nats-server
  libssl-dev liburing-dev
  libboost-dev libboost-system-dev nlohmann-json3-dev libvalijson-dev catch2 libcli11-dev
  prometheus-cpp-dev
  postgresql postgresql-contrib nginx
)
tests=(
  haproxy
  python3-yaml python3-kubernetes systemd prometheus
  chromium
  clang-16 libclang-rt-16-dev
)
packages=("${demo[@]}")
case "${1:-}" in
  --demo) ;;
  --demo-haproxy) packages+=(haproxy) ;;
  --demo-ts)
    # The demo with --app-server ts: Node.js for examples/inventory-ts (Debian's only when there
    # is no node yet, as below).
    command -v node >/dev/null 2>&1 || packages+=(nodejs)
    command -v npm >/dev/null 2>&1 || packages+=(npm)
    ;;
  *)
    packages+=("${tests[@]}")
    # Node.js for the browser client's tests and the browser end-to-end test (tests/e2e).
    # Debian's only when there is no node yet: an installed NodeSource node bundles npm and
    # conflicts with Debian's.
    command -v node >/dev/null 2>&1 || packages+=(nodejs)
    command -v npm >/dev/null 2>&1 || packages+=(npm)
    ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's postgresql package starts a cluster on 5432; outlive's harness starts its own servers.
