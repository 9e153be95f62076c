#!/usr/bin/env bash
# Builds the TypeScript inventory server into dist/: its packages from package-lock.json with `npm
# ci` (again when the lock or @outlive/server in clients/server changed since the last install; the
# .npmrc installs @outlive/server as a copy, so zod and pg resolve here), then `tsc` when a source
# is newer than dist/server.js. outlive_demo_run --app-server ts runs it before it starts the
# server; tests/e2e/run.sh --app-server ts too. Needs Node 20 or newer and the npm registry (or a
# warm npm cache).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "examples/inventory-ts/build.sh: node and npm are needed (Node 20 or newer; scripts/install-deps.sh installs them)" >&2
  exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "examples/inventory-ts/build.sh: Node $major is too old; Node 20 or newer is needed" >&2
  exit 1
fi
stamp=$(cat package-lock.json .npmrc ../../clients/server/package.json ../../clients/server/index.js \
  ../../clients/server/index.d.ts | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.outlive-installed 2>/dev/null || true)" != "$stamp" ]; then
  echo "inventory-ts: npm ci (@outlive/server from clients/server, pg, zod, typescript)"
  npm ci --no-audit --no-fund --prefer-offline --loglevel=error
  echo "$stamp" > node_modules/.outlive-installed
fi
stale=1
if [ -f dist/server.js ]; then
  stale=0
  for f in src/*.ts tsconfig.json node_modules/.outlive-installed; do
    [ "$f" -nt dist/server.js ] && stale=1
  done
fi
if [ "$stale" = 1 ]; then
  echo "inventory-ts: tsc -> dist/"
  npx --no-install tsc -p tsconfig.json
  touch dist/server.js
fi
