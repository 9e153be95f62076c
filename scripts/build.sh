#!/usr/bin/env bash
# Configures and builds into build/ (or $BUILD_DIR). Extra args go to cmake, e.g.
#   BUILD_DIR=build-asan scripts/build.sh -DOUTLIVE_SANITIZE=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
# ccache across clones of the repository (CI builds a fresh clone in another folder).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
