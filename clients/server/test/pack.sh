#!/bin/sh
# `npm pack`, then a scratch project installs the tarball with its peers (zod, pg, postgres, packed
# from our own node_modules so the install stays offline), imports it in Node, publishes through a
# stand-in transaction and compiles a TypeScript file against the installed declarations.
set -eu
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
tarball=$(npm pack --silent --pack-destination "$scratch")
echo "clients/server: npm pack -> $tarball, files:"
files=$(tar -tzf "$scratch/$tarball" | sed 's#^package/##' | sort | tr '\n' ' ')
echo "  $files"
expected="LICENSE README.md index.d.ts index.js package.json "
if [ "$files" != "$expected" ]; then
  echo "clients/server: the package should hold exactly: $expected" >&2
  exit 1
fi
# The peers and what their types need, packed from node_modules (npm ci caches tarballs, not the
# registry metadata an install by name needs).
peers=""
for dir in zod pg pg-pool pg-protocol pg-types pg-connection-string pgpass pg-int8 postgres-array postgres-bytea postgres-date postgres-interval split2 xtend postgres @types/pg @types/node undici-types; do
  peers="$peers ./$(npm pack --silent --ignore-scripts --pack-destination "$scratch" "./node_modules/$dir")"
done
tsc="$PWD/node_modules/.bin/tsc"

cd "$scratch"
echo '{"name":"scratch","private":true,"type":"module"}' > package.json
# shellcheck disable=SC2086 # $peers is a list of file names without spaces
npm install --offline --no-audit --no-fund --loglevel=error "./$tarball" $peers
node --input-type=module -e '
import assert from "node:assert/strict";
import { z } from "zod";
const server = await import("@outlive/server");
assert.equal(typeof server.defineLive, "function");
assert.equal(server.SIGNATURE_TOLERANCE_S, 300);
const live = server.defineLive({ appId: "inventory", event: z.object({ type: z.string() }) });
const calls = [];
await live.publish({ query: async (text, values) => calls.push(values) }, { key: "w1", data: { type: "x" } });
assert.deepEqual(calls, [["inventory", "w1", "{\"type\":\"x\"}", false, null]]);
await assert.rejects(live.publish({ query: async () => {} }, { key: "w1", data: { type: new Date() } }), server.LiveValidationError);
const section = live.replicaConfig({ w: { scope: z.object({ w: z.string() }), keys: () => [], authorize: () => [] } }, { url: "http://x/h" });
assert.equal(section.channels.w.hook.url, "http://x/h");
await assert.rejects(import("@outlive/server/test/servers.mjs"), { code: "ERR_PACKAGE_PATH_NOT_EXPORTED" });
console.log("clients/server: the installed package imports, publishes and prints its configuration");
'
cat > main.ts <<'TS'
import { z } from "zod";
import pg from "pg";
import { defineLive, channel, type LiveHandler } from "@outlive/server";
const live = defineLive({ appId: "inventory", event: z.object({ type: z.literal("item.changed"), itemId: z.string() }) });
export async function write(client: pg.PoolClient): Promise<void> {
  await live.publish(client, { key: "w1", data: { type: "item.changed", itemId: "i1" } });
}
export const handler: LiveHandler = live.routes(
  { w: channel({ scope: z.object({ w: z.string() }), keys: ({ w }) => [w], authorize: (_k, viewers) => viewers.map((v) => v.id) }) },
  { secret: "s" },
);
TS
echo '{"compilerOptions":{"module":"nodenext","moduleResolution":"nodenext","strict":true,"noEmit":true,"lib":["es2022","dom"],"types":["node"]},"files":["main.ts"]}' > tsconfig.json
"$tsc" -p tsconfig.json
echo "clients/server: the installed package's types compile (tsc --noEmit)"
