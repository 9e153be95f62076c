#!/usr/bin/env bash
# Runs the browser end-to-end test (CTest e2e:browser, and e2e:browser-haproxy with --gateway
# haproxy). Installs playwright-core from the npm registry with `npm ci` into tests/e2e/node_modules
# when package-lock.json changed since the last install (a fresh clone installs once), then runs
# browser.test.mjs with the given arguments:
#   tests/e2e/run.sh [--demo build/examples/inventory/outlive_demo_run] [--artifacts build/e2e-artifacts]
#                    [--gateway nginx|haproxy] [--auth session|jwt] [--app-server cpp|ts]
#                    [--websockets allowed|refused]
# With --app-server ts (CTest e2e:browser-ts) it also builds examples/inventory-ts (its build.sh:
# npm ci when its lock changed, tsc), the TypeScript app server the demo then runs.
# Needs Node 18 or newer and Chromium (/usr/bin/chromium, or CHROMIUM=...): scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")"
../../scripts/npm-ci.sh tests/e2e/run.sh 18
prev=""
for a in "$@"; do
  if [ "$prev" = --app-server ] && [ "$a" = ts ]; then
    ../../examples/inventory-ts/build.sh
  fi
  prev=$a
done
exec node browser.test.mjs "$@"
