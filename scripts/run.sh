#!/usr/bin/env bash
# The README's run command: installs, builds, and runs outlive on an embedded Postgres and NATS
# (started in .outlive-dev/, kept between runs) with the inventory demo configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
exec build/src/app/outlive dev --config examples/inventory/outlive.json --data .outlive-dev
