// End to end: publish() in a transaction on a real PostgreSQL 15, a real replica (`outlive serve`)
// publishing to a real nats-server, and a websocket tab (ws) that receives what was committed and
// nothing of what rolled back; cursor() from the replica. The channel's scope is the JSON Schema
// replicaConfig() prints; its keys and authorize are SQL here, and the application's TypeScript
// (routes()) in the second part.
// Skipped, saying so, when the outlive binary is not built and OUTLIVE_BIN is not set.
import { test, before, after, describe } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
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

// The replica calls routes() (SPEC 5.4 rev 4): a channel whose keys() and authorize() are the
// application's TypeScript, served by `outlive serve` from replicaConfig()'s section.
describe("hook channels answered by routes()", { skip: bin ? false : "the outlive binary is not built (build/src/app/outlive) and OUTLIVE_BIN is not set" }, () => {
  const SECRET = "the hook secret of replica.test.mjs";
  const asked = [];
  const hookChannels = {
    warehouse: {
      scope: z.object({ warehouse: z.string().min(1) }).strict(),
      keys: async ({ warehouse }, viewer) => {
        asked.push(["keys", warehouse, viewer.id]);
        return warehouse === "nowhere" ? null : [`wh-${warehouse}`];
      },
      authorize: async (key, viewers) => {
        asked.push(["authorize", key, viewers.map((v) => v.id)]);
        // ada reads every warehouse, bob only north
        return viewers.filter((v) => v.id === "user:ada" || key === "wh-north").map((v) => v.id);
      },
    },
  };
  let pgServer, nats, replica, hooks, dir;
  const sessions = { "tok-ada": "user:ada", "tok-bob": "user:bob" };
  before(async () => {
    pgServer = await startPostgres();
    await migrate(pgServer.url);
    nats = await startNats();
    const handle = live.routes(hookChannels, { secret: SECRET });
    hooks = createServer(async (req, res) => {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const response = await handle(new Request(`http://${req.headers.host}${req.url}`, { method: req.method, headers: req.headers, body: Buffer.concat(chunks) }));
      res.writeHead(response.status, Object.fromEntries(response.headers));
      res.end(Buffer.from(await response.arrayBuffer()));
    });
    await new Promise((r) => hooks.listen(0, "127.0.0.1", r));
    dir = mkdtempSync(join(tmpdir(), "outlive-server-hooks-"));
    writeFileSync(join(dir, "hook.secret"), SECRET + "\n");
    const rows = Object.entries(sessions)
      .map(([t, who]) => `('${createHash("sha256").update(t).digest("hex")}', '${who}')`)
      .join(", ");
    replica = await startReplica(bin, {
      replica: "ts2",
      database: pgServer.url,
      nats: [nats.url],
      hook_secret_file: join(dir, "hook.secret"),
      auth: {
        sessions: `SELECT s.who AS subject, s.who AS actor, NULL::text[] AS scopes, false AS app_session FROM (VALUES ${rows}) AS s(sha, who) WHERE s.sha = $1`,
      },
      publisher: { poll_ms: 200 },
      apps: { inventory: live.replicaConfig(hookChannels, { url: `http://127.0.0.1:${hooks.address().port}/outlive/hooks` }) },
    });
  });
  after(async () => {
    await replica?.stop();
    await new Promise((r) => (hooks ? hooks.close(r) : r()));
    await nats?.stop();
    await pgServer?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("keys() and authorize() in TypeScript decide what each tab receives", async () => {
    const ada = openTab(replica.url, "tok-ada");
    const bob = openTab(replica.url, "tok-bob");
    await ada.opened;
    await bob.opened;
    bob.send({ type: "sub", id: "x", channel: "warehouse", scope: { warehouse: "nowhere" } });
    await bob.next("not_found", (f) => f.type === "error" && f.id === "x");
    assert.equal(bob.frames.find((f) => f.id === "x").code, "not_found");
    bob.send({ type: "sub", id: "s", channel: "warehouse", scope: { warehouse: "south" } });
    await bob.next("not_found for south", (f) => f.type === "error" && f.id === "s");
    for (const tab of [ada, bob]) {
      tab.send({ type: "sub", id: "n", channel: "warehouse", scope: { warehouse: "north" } });
      await tab.next("subscribed", (f) => f.type === "subscribed" && f.id === "n");
    }
    ada.send({ type: "sub", id: "s", channel: "warehouse", scope: { warehouse: "south" } });
    await ada.next("subscribed", (f) => f.type === "subscribed" && f.id === "s");

    const pool = new pg.Pool({ connectionString: pgServer.url, max: 1 });
    try {
      const client = await pool.connect();
      try {
        await client.query("BEGIN");
        await live.publish(client, { key: "wh-south", data: { type: "item.changed", itemId: "s-1" } });
        await live.publish(client, { key: "wh-north", data: { type: "item.changed", itemId: "n-1" } });
        await client.query("COMMIT");
      } finally {
        client.release();
      }
      await live.wake(pool);
    } finally {
      await pool.end();
    }
    await ada.next("north's update", (f) => f.type === "update" && f.data?.itemId === "n-1");
    await bob.next("north's update", (f) => f.type === "update" && f.data?.itemId === "n-1");
    assert.deepEqual(ada.frames.filter((f) => f.type === "update").map((f) => f.data.itemId), ["s-1", "n-1"]);
    assert.deepEqual(bob.frames.filter((f) => f.type === "update").map((f) => f.data.itemId), ["n-1"]);
    assert.ok(asked.some(([op, key]) => op === "authorize" && key === "wh-north"), JSON.stringify(asked));
    ada.ws.close();
    bob.ws.close();
  });

  const check = (file) =>
    new Promise((done) => {
      execFile(bin, ["check", "--config", file], { encoding: "utf8", timeout: 30000 }, (error, stdout, stderr) =>
        done({ status: error ? error.code : 0, stdout, stderr }),
      );
    });

  test("outlive check reaches the routes with the configured secret", async () => {
    const file = join(dir, "check.json");
    writeFileSync(file, JSON.stringify({
      database: pgServer.url,
      nats: [nats.url],
      hook_secret_file: join(dir, "hook.secret"),
      auth: { sessions: "SELECT 'u'::text AS subject, 'u'::text AS actor, NULL::text[] AS scopes, false AS app_session WHERE $1 IS NOT NULL" },
      apps: { inventory: live.replicaConfig(hookChannels, { url: `http://127.0.0.1:${hooks.address().port}/outlive/hooks` }) },
    }));
    // Not spawnSync: the routes answer from this process's event loop.
    const r = await check(file);
    assert.equal(r.status, 0, r.stdout + r.stderr);
    writeFileSync(join(dir, "wrong.secret"), "not the secret");
    writeFileSync(file, JSON.stringify({ ...JSON.parse(readFileSync(file, "utf8")), hook_secret_file: join(dir, "wrong.secret") }));
    const wrong = await check(file);
    assert.equal(wrong.status, 1, wrong.stdout + wrong.stderr);
    assert.match(wrong.stdout, /\/apps\/inventory\/channels\/warehouse\/hook: hook POST .* status 401/);
  });
});
