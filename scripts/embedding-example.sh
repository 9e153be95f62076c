#!/usr/bin/env bash
# The installed-library check (issue 16): installs the build into a temp prefix, builds
# examples/embedding there as a separate CMake project with find_package(outlive), then runs the
# example on real PostgreSQL and nats-server through tests/embedding/example_check.cpp.
#   scripts/embedding-example.sh BUILD_DIR CHECK_BINARY
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
check=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
# The package config and the pkg-config file are both usable.
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs outlive >/dev/null
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=true
cmake -S "$root/examples/embedding" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" >/dev/null
cmake --build "$work/build" -j2
OUTLIVE_NOTES_APP="$work/build/notes_app" "$check"
