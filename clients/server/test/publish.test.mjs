// publish / publishAccess / wake against a real PostgreSQL 15 with the outbox migrations, through
// node-postgres and postgres.js, plus the JSON checks that throw before any SQL.
import { test, before, after, describe } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import postgres from "postgres";
import { z } from "zod";
import { defineLive, LiveValidationError } from "../index.js";
import { startPostgres, migrate } from "./servers.mjs";

const event = z.discriminatedUnion("type", [
  z.object({ type: z.literal("item.changed"), itemId: z.string(), at: z.string().optional(), tags: z.array(z.string()).optional() }),
  z.object({ type: z.literal("item.deleted"), itemId: z.string() }),
  z.object({ type: z.literal("blob"), text: z.string() }),
  z.object({ type: z.literal("any"), value: z.unknown() }),
]);
const live = defineLive({ appId: "inventory", event });

// A transaction stand-in that records statements: for the checks that must throw before any SQL.
function recordingTx() {
  const calls = [];
  return { calls, query: async (text, values) => calls.push({ text, values }) };
}

describe("JSON checks before SQL", () => {
  const cases = [
    ["a Date", { type: "any", value: new Date() }, /a Date is not JSON/],
    ["a Date for a string field", { type: "item.changed", itemId: "a", at: new Date() }, /data\.at: a Date/],
    ["undefined in an array", { type: "any", value: [1, undefined] }, /data\.value\[1\]: undefined is not JSON/],
    ["a hole in an array", { type: "any", value: [1, , 3] }, /a hole/], // eslint-disable-line no-sparse-arrays
    ["a bigint", { type: "any", value: 10n }, /bigint/],
    ["NaN", { type: "any", value: NaN }, /NaN is not a JSON number/],
    ["Infinity", { type: "any", value: -Infinity }, /Infinity is not a JSON number/],
    ["a function", { type: "any", value: () => 1 }, /a function is not JSON/],
    ["a Map", { type: "any", value: new Map() }, /an instance of Map/],
    ["a class instance", { type: "any", value: new (class Point { x = 1 })() }, /an instance of Point/],
    ["a circular reference", (() => { const o = { type: "any", value: {} }; o.value.self = o.value; return o; })(), /circular/],
    ["U+0000 in a string", { type: "item.changed", itemId: "a\u0000b" }, /U\+0000/],
    ["a lone surrogate", { type: "item.changed", itemId: "a\ud800" }, /lone surrogate/],
    ["zod: wrong type", { type: "item.changed", itemId: 5 }, /data\.itemId: /],
    ["zod: unknown variant", { type: "nope" }, /does not match the event schema/],
    ["undefined data", undefined, /data is required/],
  ];
  for (const [name, data, message] of cases) {
    test(`${name} is a violation, thrown before any SQL`, async () => {
      const tx = recordingTx();
      await assert.rejects(live.publish(tx, { key: "w1", data }), (e) => {
        assert.ok(e instanceof LiveValidationError, `${e}`);
        assert.match(e.message, message);
        assert.ok(e.issues.length > 0);
        return true;
      });
      assert.equal(tx.calls.length, 0);
    });
  }

  test("an undefined object property is dropped as JSON drops it", async () => {
    const tx = recordingTx();
    await live.publish(tx, { key: "w1", data: { type: "item.changed", itemId: "a", at: undefined } });
    assert.equal(tx.calls.length, 1);
    assert.deepEqual(tx.calls[0].values, ["inventory", "w1", '{"type":"item.changed","itemId":"a"}', false, null]);
    assert.match(tx.calls[0].text, /events\.publish_live\(\$1::text, \$2::text, \$3::text::jsonb, \$4::boolean, \$5::text\)/);
  });

  test("the key has 1 to 600 characters (code points, as Postgres counts)", async () => {
    const tx = recordingTx();
    const data = { type: "item.deleted", itemId: "a" };
    await assert.rejects(live.publish(tx, { key: "", data }), RangeError);
    await assert.rejects(live.publish(tx, { key: "x".repeat(601), data }), RangeError);
    await assert.rejects(live.publish(tx, { key: 5, data }), TypeError);
    await live.publish(tx, { key: "😀".repeat(600), data }); // 1,200 UTF-16 units, 600 characters
    assert.equal(tx.calls.length, 1);
  });

  test("a pg Pool and postgres.js's sql are refused: they are not a transaction", async () => {
    const pool = new pg.Pool({ connectionString: "postgresql://nobody@127.0.0.1:1/x" });
    await assert.rejects(live.publish(pool, { key: "k", data: { type: "item.deleted", itemId: "a" } }), /not a pg Pool/);
    await pool.end();
    const sql = postgres("postgresql://nobody@127.0.0.1:1/x");
    await assert.rejects(live.publish(sql, { key: "k", data: { type: "item.deleted", itemId: "a" } }), /sql\.begin/);
    await sql.end();
    await assert.rejects(live.publish({}, { key: "k", data: { type: "item.deleted", itemId: "a" } }), /expected a node-postgres client/);
  });

  test("defineLive checks its arguments", () => {
    assert.throws(() => defineLive({ appId: "Inventory", event }), /appId must match/);
    assert.throws(() => defineLive({ appId: "inventory", event: {} }), /zod schema/);
  });
});

describe("against PostgreSQL 15", () => {
  let server;
  let pool;
  let sql;
  let notifications = [];
  let listener;
  before(async () => {
    server = await startPostgres();
    const how = await migrate(server.url);
    console.log(`# migrations applied with ${how}`);
    pool = new pg.Pool({ connectionString: server.url, max: 4 });
    sql = postgres(server.url, { max: 2, onnotice: () => {} });
    listener = new pg.Client({ connectionString: server.url });
    await listener.connect();
    listener.on("notification", (n) => notifications.push(n));
    await listener.query("LISTEN outlive_wake");
  });
  after(async () => {
    await listener?.end();
    await pool?.end();
    await sql?.end();
    await server?.stop();
  });

  async function rows(key) {
    const r = await pool.query(
      "SELECT app_id, topic, key, envelope, coalesce_key FROM events.outbox WHERE key = $1 ORDER BY position",
      [key],
    );
    return r.rows;
  }

  // The two drivers, each as a function running `fn(tx)` in a transaction.
  const drivers = {
    "node-postgres": async (fn) => {
      const client = await pool.connect();
      try {
        await client.query("BEGIN");
        await fn(client);
        await client.query("COMMIT");
      } catch (e) {
        await client.query("ROLLBACK");
        throw e;
      } finally {
        client.release();
      }
    },
    "postgres.js": (fn) => sql.begin(fn),
  };

  for (const [driver, inTransaction] of Object.entries(drivers)) {
    describe(driver, () => {
      test("a transaction that commits leaves the row with the envelope", async () => {
        const key = `${driver}:commit`;
        await inTransaction(async (tx) => {
          await live.publish(tx, { key, data: { type: "item.changed", itemId: "i1", tags: ["a", "é"] } });
        });
        assert.deepEqual(await rows(key), [
          {
            app_id: "inventory",
            topic: "live",
            key,
            envelope: { v: 1, k: key, d: { type: "item.changed", itemId: "i1", tags: ["a", "é"] } },
            coalesce_key: null,
          },
        ]);
      });

      test("a transaction that rolls back leaves nothing", async () => {
        const key = `${driver}:rollback`;
        await assert.rejects(
          inTransaction(async (tx) => {
            await live.publish(tx, { key, data: { type: "item.deleted", itemId: "i1" } });
            throw new Error("the app's own failure");
          }),
          /the app's own failure/,
        );
        assert.deepEqual(await rows(key), []);
      });

      test("a zod violation throws and the transaction rolls back", async () => {
        const key = `${driver}:violation`;
        await assert.rejects(
          inTransaction(async (tx) => {
            await live.publish(tx, { key, data: { type: "item.deleted", itemId: "first" } });
            await live.publish(tx, { key, data: { type: "item.deleted", itemId: 42 } });
          }),
          LiveValidationError,
        );
        assert.deepEqual(await rows(key), []);
      });

      test("a Date in data is a violation and the transaction rolls back", async () => {
        const key = `${driver}:date`;
        await assert.rejects(
          inTransaction(async (tx) => {
            await live.publish(tx, { key, data: { type: "item.deleted", itemId: "first" } });
            await live.publish(tx, { key, data: { type: "item.changed", itemId: "x", at: new Date() } });
          }),
          /a Date is not JSON/,
        );
        assert.deepEqual(await rows(key), []);
      });

      test("publishAccess writes the access row before the data row", async () => {
        const key = `${driver}:access`;
        await inTransaction(async (tx) => {
          await live.publishAccess(tx, key, { type: "item.changed", itemId: "i2" });
          await live.publishAccess(tx, `${key}:only`);
        });
        assert.deepEqual(
          (await rows(key)).map((r) => r.envelope),
          [{ v: 1, k: key, access: true }, { v: 1, k: key, d: { type: "item.changed", itemId: "i2" } }],
        );
        assert.deepEqual((await rows(`${key}:only`)).map((r) => r.envelope), [{ v: 1, k: `${key}:only`, access: true }]);
      });

      test("a coalesce key joins the transaction's updates: one row, the last data", async () => {
        const key = `${driver}:coalesce`;
        await inTransaction(async (tx) => {
          for (const itemId of ["a", "b", "c"]) {
            await live.publish(tx, { key, data: { type: "item.changed", itemId }, coalesceKey: `${key}:item` });
          }
        });
        const r = await rows(key);
        assert.equal(r.length, 1);
        assert.equal(r[0].coalesce_key, `${key}:item`);
        assert.equal(r[0].envelope.d.itemId, "c");
      });

      test("data above 32 KiB is not an error: the row is a resync", async () => {
        const key = `${driver}:oversized`;
        await inTransaction(async (tx) => {
          await live.publish(tx, { key, data: { type: "blob", text: "x".repeat(40 * 1024) } });
        });
        assert.deepEqual((await rows(key)).map((r) => r.envelope), [{ v: 1, k: key, resync: "oversized" }]);
      });

      test("wake notifies outlive_wake with the app id", async () => {
        notifications = [];
        if (driver === "node-postgres") await live.wake(pool);
        else await live.wake(sql);
        await new Promise((r) => {
          const deadline = Date.now() + 5000;
          const poll = () => (notifications.length || Date.now() > deadline ? r() : setTimeout(poll, 10));
          poll();
        });
        assert.deepEqual(notifications.map((n) => [n.channel, n.payload]), [["outlive_wake", "inventory"]]);
      });
    });
  }

  test("a role without a grant is refused by the database (42501), and the transaction fails", async () => {
    await pool.query("CREATE ROLE stranger LOGIN");
    const url = server.url.replace("postgres@", "stranger@");
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      await c.query("BEGIN");
      await assert.rejects(live.publish(c, { key: "k", data: { type: "item.deleted", itemId: "a" } }), (e) => e.code === "42501");
      await c.query("ROLLBACK");
    } finally {
      await c.end();
    }
  });
});
