#!/bin/sh
# @outlive/server's checks: its dev dependencies from package-lock.json (npm ci), the declarations
# and the typed example (tsc --noEmit), the tests (Node's built-in runner) against a throwaway
# PostgreSQL 15 and, when the outlive binary is built, nats-server and a real replica (`outlive
# serve`), then `npm pack` installed into a scratch project (test/pack.sh).
#   OUTLIVE_BIN   the outlive binary (default: build/src/app/outlive of this repository; when that is
#                 missing and OUTLIVE_BIN is unset, the replica test is skipped and says so)
# Needs Node 20 or newer, the npm registry (or a warm npm cache), PostgreSQL 15's binaries
# (/usr/lib/postgresql/15/bin, or OUTLIVE_PG_BIN) and, as root, the postgres user.
set -eu
# A relative OUTLIVE_BIN is relative to where the script was started from.
case "${OUTLIVE_BIN:-}" in
  "" | /*) ;;
  *) OUTLIVE_BIN="$PWD/$OUTLIVE_BIN" ;;
esac
[ -n "${OUTLIVE_BIN:-}" ] && export OUTLIVE_BIN
cd "$(dirname "$0")"
../../scripts/npm-ci.sh clients/server/test.sh 20
echo "clients/server: tsc --noEmit (declarations and examples/)"
npx --no-install tsc -p tsconfig.json
node --test --test-concurrency=1 test/*.test.mjs
test/pack.sh
