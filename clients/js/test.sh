#!/bin/sh
# The browser client's checks: its dev dependencies from package-lock.json (npm ci), the unit and
# React hook tests (Node's built-in runner, jsdom for the DOM), the typed examples against the
# declarations (tsc --noEmit), and `npm pack` installed into a scratch project (test/pack.sh).
# Needs Node 20 or newer and the npm registry (or a warm npm cache).
set -eu
cd "$(dirname "$0")"
../../scripts/npm-ci.sh clients/js/test.sh 20
echo "clients/js: tsc --noEmit (declarations and examples/)"
npx --no-install tsc -p tsconfig.json
node --test test/*.test.mjs
test/pack.sh
