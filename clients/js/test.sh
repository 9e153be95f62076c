#!/bin/sh
# The browser client's checks: its dev dependencies from package-lock.json (npm ci), the unit and
# React hook tests (Node's built-in runner, jsdom for the DOM), the typed examples against the
# declarations (tsc --noEmit), and `npm pack` installed into a scratch project (test/pack.sh).
# Needs Node 20 or newer and the npm registry (or a warm npm cache).
set -eu
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1; then
  echo "clients/js/test.sh: node is not installed (Node 20 or newer is needed)" >&2
  exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "clients/js/test.sh: Node $major is too old; Node 20 or newer is needed" >&2
  exit 1
fi
npm ci --no-audit --no-fund --prefer-offline --loglevel=error
echo "clients/js: tsc --noEmit (declarations and examples/)"
npx --no-install tsc -p tsconfig.json
node --test test/*.test.mjs
test/pack.sh
