// End to end: publish() in a transaction on a real PostgreSQL 15, a real replica (`outlive serve`)
// publishing to a real nats-server, and a websocket tab (ws) that receives what was committed and
// nothing of what rolled back; cursor() from the replica. The channel's scope is the JSON Schema
// replicaConfig() prints; its keys and authorize are SQL (this build does not serve hook channels).
// Skipped, saying so, when the outlive binary is not built and OUTLIVE_BIN is not set.
import { test, before, after, describe } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import postgres from "postgres";
import WebSocket from "ws";
import { z } from "zod";
import { defineLive } from "../index.js";
import { outliveBinary, startPostgres, migrate, startNats, startReplica, until } from "./servers.mjs";

const bin = outliveBinary();
const live = defineLive({
  appId: "inventory",
  event: z.object({ type: z.literal("item.changed"), itemId: z.string() }),
});
const channels = {
  warehouse: { scope: z.object({ warehouse: z.string().min(1) }).strict(), keys: () => [], authorize: () => [] },
};

// A tab: every frame it received, and a wait for the next one matching a predicate.
function openTab(url, token) {
  const ws = new WebSocket(url.replace(/^http/, "ws") + "/api/inventory/live", { headers: { cookie: `session=${token}` } });
  const frames = [];
  ws.on("message", (m) => frames.push(JSON.parse(m.toString())));
  let closed = null;
  ws.on("close", (code) => (closed = code));
  return {
    ws,
    frames,
    opened: new Promise((ok, fail) => {
      ws.once("open", ok);
      ws.once("error", fail);
    }),
    send: (m) => ws.send(JSON.stringify(m)),
    next: (what, predicate, ms = 10000) =>
      until(what, ms, () => {
        if (closed !== null) throw new Error(`the socket closed with ${closed}: ${JSON.stringify(frames)}`);
        return frames.find(predicate);
      }),
  };
}

describe("against a real replica", { skip: bin ? false : "the outlive binary is not built (build/src/app/outlive) and OUTLIVE_BIN is not set" }, () => {
  let pgServer, nats, replica, pool, sql;
  const token = "tab-token-ada";
  before(async () => {
    pgServer = await startPostgres();
    await migrate(pgServer.url);
    nats = await startNats();
    const section = live.replicaConfig(channels, { url: "http://127.0.0.1:1/unused" });
    const sha = createHash("sha256").update(token).digest("hex");
    replica = await startReplica(bin, {
      replica: "ts1",
      database: pgServer.url,
      nats: [nats.url],
      auth: {
        sessions: `SELECT 'user:ada'::text AS subject, 'user:ada'::text AS actor, NULL::text[] AS scopes, false AS app_session WHERE $1 = '${sha}'`,
      },
      publisher: { poll_ms: 200 },
      apps: {
        inventory: {
          channels: {
            warehouse: {
              scope: section.channels.warehouse.scope,
              keys: "SELECT $1->>'warehouse' AS key WHERE $2 IS NOT NULL",
              authorize: "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v WHERE $1 IS NOT NULL",
            },
          },
        },
      },
    });
    pool = new pg.Pool({ connectionString: pgServer.url, max: 2 });
    sql = postgres(pgServer.url, { max: 1, onnotice: () => {} });
  });
  after(async () => {
    await pool?.end();
    await sql?.end();
    await replica?.stop();
    await nats?.stop();
    await pgServer?.stop();
  });

  test("a tab receives what committed, through node-postgres and postgres.js, and nothing of a rollback", async () => {
    const cursor = await live.cursor({ url: replica.url });
    assert.equal(typeof cursor, "string");
    assert.ok(cursor.length > 0);

    const tab = openTab(replica.url, token);
    await tab.opened;
    tab.send({ type: "sub", id: "w1", channel: "warehouse", scope: { warehouse: "north" }, cursor });
    await tab.next("subscribed", (f) => f.type === "subscribed" && f.id === "w1");

    // node-postgres: one that rolls back, then one that commits.
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      await live.publish(client, { key: "north", data: { type: "item.changed", itemId: "rolled-back" } });
      await client.query("ROLLBACK");
      await client.query("BEGIN");
      await live.publish(client, { key: "north", data: { type: "item.changed", itemId: "pg-1" } });
      await client.query("COMMIT");
    } finally {
      client.release();
    }
    await live.wake(pool);
    // postgres.js: a zod violation rolls its transaction back, then one that commits.
    await assert.rejects(
      sql.begin(async (tx) => {
        await live.publish(tx, { key: "north", data: { type: "item.changed", itemId: "violated-tx" } });
        await live.publish(tx, { key: "north", data: { type: "item.changed", itemId: 7 } });
      }),
      /does not match the event schema/,
    );
    await sql.begin(async (tx) => {
      await live.publish(tx, { key: "north", data: { type: "item.changed", itemId: "js-1" } });
    });
    await live.wake(sql);

    await tab.next("the postgres.js update", (f) => f.type === "update" && f.data?.itemId === "js-1");
    const updates = tab.frames.filter((f) => f.type === "update");
    assert.deepEqual(
      updates.map((f) => [f.ids, f.key, f.data]),
      [
        [["w1"], "north", { type: "item.changed", itemId: "pg-1" }],
        [["w1"], "north", { type: "item.changed", itemId: "js-1" }],
      ],
    );
    // The cursor moved on with the updates.
    const later = await live.cursor({ url: replica.url });
    assert.notEqual(later, cursor);
    tab.ws.close();
  });

  test("cursor() of an app the replica does not serve throws with the replica's answer", async () => {
    const other = defineLive({ appId: "billing", event: z.object({}) });
    await assert.rejects(other.cursor({ url: replica.url }), (e) => e.status === 404 && /unknown_app/.test(e.message));
  });
});

test("this build's replica refuses replicaConfig()'s hook channels, naming the path (issue 44 item 1)", { skip: bin ? false : "the outlive binary is not built" }, () => {
  const dir = mkdtempSync(join(tmpdir(), "outlive-server-check-"));
  try {
    const file = join(dir, "outlive.json");
    writeFileSync(join(dir, "hook.secret"), "s\n");
    writeFileSync(file, JSON.stringify({
      database: "postgresql://postgres@127.0.0.1:1/x",
      nats: ["nats://127.0.0.1:1"],
      hook_secret_file: "hook.secret",
      apps: { inventory: live.replicaConfig(channels, { url: "http://127.0.0.1:3000/outlive/hooks" }) },
    }));
    const r = spawnSync(bin, ["check", "--config", file], { encoding: "utf8", timeout: 20000 });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /\/apps\/inventory\/channels\/warehouse\/hook: hook channels .* not served by this build yet/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
