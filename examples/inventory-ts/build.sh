#!/usr/bin/env bash
# Builds the TypeScript inventory server into dist/: its packages from package-lock.json with `npm
# ci` (again when the lock or @outlive/server in clients/server changed since the last install; the
# .npmrc installs @outlive/server as a copy, so zod and pg resolve here), then `tsc` when a source
# is newer than dist/server.js. outlive_demo_run --app-server ts runs it before it starts the
# server; tests/e2e/run.sh --app-server ts too. Needs Node 20 or newer and the npm registry (or a
# warm npm cache).
set -euo pipefail
cd "$(dirname "$0")"
../../scripts/npm-ci.sh examples/inventory-ts/build.sh 20 .npmrc ../../clients/server/package.json \
  ../../clients/server/index.js ../../clients/server/index.d.ts
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
