#!/bin/sh
# The one way the repository's Node packages get their dependencies: checks that node and npm are
# there and new enough, then runs `npm ci` in the current directory when package-lock.json, or any
# FILE named (a package installed from this repository as a copy), changed since the last install
# here (a stamp in node_modules/), so a fresh clone installs once and later runs start at once.
#   scripts/npm-ci.sh WHO MIN_NODE_MAJOR [FILE ...]     (run from the package's directory)
# WHO names the caller in messages. Exits 1, saying why, when node or npm is missing or too old.
set -eu
who=$1
min=$2
shift 2
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "$who: node and npm are needed (Node $min or newer; scripts/install-deps.sh installs them)" >&2
  exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt "$min" ]; then
  echo "$who: Node $major is too old; Node $min or newer is needed" >&2
  exit 1
fi
stamp=$(cat package-lock.json "$@" | sha256sum | cut -d' ' -f1)
if [ "$(cat node_modules/.outlive-installed 2>/dev/null || true)" != "$stamp" ]; then
  echo "$who: npm ci ($(pwd))"
  npm ci --no-audit --no-fund --prefer-offline --loglevel=error
  echo "$stamp" > node_modules/.outlive-installed
fi
