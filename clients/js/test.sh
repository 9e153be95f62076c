#!/bin/sh
# Runs the browser client's tests with Node's built-in test runner (Node 20 or newer, no npm packages).
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
exec node --test test/*.test.mjs
