#!/bin/sh
# `npm pack`, then a scratch project installs the tarball offline, imports both entries in Node and
# compiles a TypeScript file against the installed declarations. Prints the package's file list.
# react and @types/react (with csstype, its one dependency) come as tarballs packed from our own
# node_modules: `npm ci` caches tarballs but not the registry metadata an install by name needs.
set -eu
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
tarball=$(npm pack --silent --pack-destination "$scratch")
echo "clients/js: npm pack -> $tarball, files:"
files=$(tar -tzf "$scratch/$tarball" | sed 's#^package/##' | sort | tr '\n' ' ')
echo "  $files"
expected="LICENSE README.md outlive.d.ts outlive.js package.json react.d.ts react.js "
if [ "$files" != "$expected" ]; then
  echo "clients/js: the package should hold exactly: $expected" >&2
  exit 1
fi
peers=$(npm pack --silent --pack-destination "$scratch" ./node_modules/react ./node_modules/@types/react ./node_modules/csstype | sed 's#^#./#' | tr '\n' ' ')
tsc="$PWD/node_modules/.bin/tsc"

cd "$scratch"
echo '{"name":"scratch","private":true,"type":"module"}' > package.json
# shellcheck disable=SC2086 # $peers is a list of file names without spaces
npm install --offline --no-audit --no-fund --loglevel=error "./$tarball" $peers
node --input-type=module -e '
import assert from "node:assert/strict";
const client = await import("@outlive/client");
assert.equal(typeof client.LiveClient, "function");
assert.equal(typeof client.checkFilter, "function");
assert.equal(client.MAX_FILTER_FIELDS, 8);
const { useLive } = await import("@outlive/client/react");
assert.equal(typeof useLive, "function");
await assert.rejects(import("@outlive/client/backoff.js"), { code: "ERR_PACKAGE_PATH_NOT_EXPORTED" });
console.log("clients/js: the installed package imports @outlive/client and @outlive/client/react");
'
cat > main.ts <<'TS'
import { LiveClient, type Filter } from "@outlive/client";
import { useLive, type LiveStatus } from "@outlive/client/react";
const filter: Filter = { type: "item.deleted" };
export const use = (c: LiveClient): LiveStatus => useLive<{ id: string }>(c, { channel: "w", filter }).status;
TS
echo '{"compilerOptions":{"module":"nodenext","moduleResolution":"nodenext","strict":true,"noEmit":true,"lib":["es2022","dom"],"types":[]},"files":["main.ts"]}' > tsconfig.json
"$tsc" -p tsconfig.json
echo "clients/js: the installed package's types compile (tsc --noEmit)"
