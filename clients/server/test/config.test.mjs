// replicaConfig(): the app's section of the replica configuration validates against
// schemas/config.schema.json (with ajv, draft 7, as the replica's valijson reads it), and each
// channel's scope, printed as JSON Schema, accepts and refuses what its zod schema does.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import Ajv from "ajv";
import { z } from "zod";
import { defineLive } from "../index.js";
import { REPO } from "./servers.mjs";

const configSchema = JSON.parse(readFileSync(join(REPO, "schemas/config.schema.json"), "utf8"));
const ajv = new Ajv({ allErrors: true, strict: false });
const validateConfig = ajv.compile(configSchema);

const live = defineLive({
  appId: "inventory",
  event: z.discriminatedUnion("type", [
    z.object({ type: z.literal("item.changed"), itemId: z.string() }),
    z.object({ type: z.literal("item.deleted"), itemId: z.string() }),
  ]),
});

const channels = {
  warehouse: {
    scope: z.object({ warehouse: z.string().min(1).max(64) }).strict(),
    keys: async () => [],
    authorize: async () => [],
  },
  my_warehouses: { collection: true, scope: z.object({}).strict(), keys: () => [], authorize: () => [] },
  item: {
    scope: z.object({ warehouse: z.string(), item: z.string().regex(/^[a-z0-9-]+$/), revision: z.number().int().optional() }).strict(),
    keys: () => [],
    authorize: () => [],
  },
};

function fullConfig(section) {
  return {
    database: "postgresql://outlive@127.0.0.1:5432/app",
    nats: ["nats://127.0.0.1:4222"],
    hook_secret_file: "hook.secret",
    hooks: { max_in_flight: 64 },
    apps: { inventory: section },
  };
}

test("replicaConfig() prints each channel's scope as JSON Schema and its hook", () => {
  const section = live.replicaConfig(channels, { url: "http://127.0.0.1:3000/outlive/hooks", timeoutMs: 2000, allowedOrigins: ["http://localhost:8080"] });
  assert.deepEqual(section.allowed_origins, ["http://localhost:8080"]);
  assert.deepEqual(section.channels.warehouse, {
    scope: {
      type: "object",
      properties: { warehouse: { type: "string", minLength: 1, maxLength: 64 } },
      required: ["warehouse"],
      additionalProperties: false,
    },
    hook: { url: "http://127.0.0.1:3000/outlive/hooks", timeout_ms: 2000 },
  });
  assert.equal(section.channels.my_warehouses.collection, true);
  assert.equal(section.channels.warehouse.collection, undefined);
});

test("replicaConfig() output validates against schemas/config.schema.json", () => {
  for (const options of [{ url: "http://127.0.0.1:3000/hooks" }, { url: "https://app.internal/hooks", timeoutMs: 10000, eventSchema: "inventory.event.json" }]) {
    const config = fullConfig(live.replicaConfig(channels, options));
    const ok = validateConfig(config);
    assert.ok(ok, JSON.stringify(validateConfig.errors, null, 2));
  }
});

test("the schema is not a rubber stamp: a channel with both hook and SQL, or a hook without url, fails", () => {
  const section = live.replicaConfig(channels, { url: "http://127.0.0.1:3000/hooks" });
  const both = structuredClone(section);
  Object.assign(both.channels.warehouse, { keys: "SELECT 1", authorize: "SELECT 1" });
  assert.equal(validateConfig(fullConfig(both)), false);
  const noUrl = structuredClone(section);
  noUrl.channels.warehouse.hook = { timeout_ms: 100 };
  assert.equal(validateConfig(fullConfig(noUrl)), false);
  const neither = structuredClone(section);
  delete neither.channels.warehouse.hook;
  assert.equal(validateConfig(fullConfig(neither)), false);
  const sql = structuredClone(section);
  delete sql.channels.warehouse.hook;
  Object.assign(sql.channels.warehouse, { keys: "SELECT 1", authorize: "SELECT 1" });
  assert.ok(validateConfig(fullConfig(sql)), "an SQL channel beside hook channels is valid (an app may mix both)");
});

test("each printed scope accepts and refuses what its zod schema does", () => {
  const section = live.replicaConfig(channels, { url: "http://x/hooks" });
  const samples = [
    {}, { warehouse: "north" }, { warehouse: "" }, { warehouse: "x".repeat(65) }, { warehouse: "north", extra: 1 },
    { warehouse: 5 }, { warehouse: "n", item: "ab-1" }, { warehouse: "n", item: "AB" }, { warehouse: "n", item: "a", revision: 2 },
    { warehouse: "n", item: "a", revision: 2.5 }, [], null, "north",
  ];
  for (const [name, ch] of Object.entries(channels)) {
    const check = ajv.compile(section.channels[name].scope);
    for (const sample of samples) {
      assert.equal(check(sample), ch.scope.safeParse(sample).success, `${name}: ${JSON.stringify(sample)}`);
    }
  }
});

test("replicaConfig() refuses what the replica would refuse, and scopes JSON Schema cannot say", () => {
  assert.throws(() => live.replicaConfig(channels, { url: "ftp://x" }), /url/);
  assert.throws(() => live.replicaConfig(channels, { url: "http://x", timeoutMs: 0 }), /timeoutMs/);
  assert.throws(() => live.replicaConfig({ "bad name": channels.warehouse }, { url: "http://x" }), /channel name/);
  assert.throws(
    () => live.replicaConfig({ d: { ...channels.warehouse, scope: z.object({ at: z.date() }) } }, { url: "http://x" }),
    /scope of channel "d" has no JSON Schema/,
  );
});

test("eventJsonSchema() prints the event schema for schemas/<app>.event.json", () => {
  const schema = live.eventJsonSchema();
  const check = ajv.compile(schema);
  assert.ok(check({ type: "item.changed", itemId: "a" }));
  assert.ok(!check({ type: "item.changed", itemId: 5 }));
});
