// Compiled by test.sh (tsc --noEmit) against index.d.ts: the seed's API as a TypeScript app writes it.
import pg from "pg";
import postgres from "postgres";
import { z } from "zod";
import { defineLive, channel, LiveValidationError, type LiveViewer, type LiveHandler } from "@outlive/server";

export const inventoryLive = defineLive({
  appId: "inventory",
  event: z.discriminatedUnion("type", [
    z.object({ type: z.literal("item.changed"), itemId: z.string() }),
    z.object({ type: z.literal("item.deleted"), itemId: z.string() }),
  ]),
});

export async function withPostgresJs(sql: postgres.Sql, warehouseId: string, itemId: string): Promise<void> {
  await sql.begin(async (tx) => {
    await tx`UPDATE inventory.items SET quantity = quantity + 1 WHERE id = ${itemId}::uuid`;
    await inventoryLive.publish(tx, { key: warehouseId, data: { type: "item.changed", itemId } });
  });
  await inventoryLive.wake(sql);
}

export async function withNodePostgres(pool: pg.Pool, warehouseId: string): Promise<void> {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await inventoryLive.publishAccess(client, warehouseId);
    await inventoryLive.publish(client, { key: warehouseId, data: { type: "item.deleted", itemId: "i1" }, coalesceKey: "x" });
    // @ts-expect-error: data is typed by the event schema
    await inventoryLive.publish(client, { key: warehouseId, data: { type: "item.moved", itemId: "i1" } });
    await client.query("COMMIT");
  } catch (e) {
    await client.query("ROLLBACK");
    if (e instanceof LiveValidationError) console.error(e.issues);
    throw e;
  } finally {
    client.release();
  }
  await inventoryLive.wake(pool);
}

declare function readersOfWarehouse(id: string, viewers: readonly LiveViewer[]): Promise<string[]>;

const channels = {
  warehouse: channel({
    scope: z.object({ warehouse: z.string() }).strict(),
    keys: async ({ warehouse }, viewer) => (viewer.id && warehouse ? [warehouse] : null),
    authorize: (key, viewers) => readersOfWarehouse(key, viewers),
  }),
  my_warehouses: {
    collection: true,
    scope: z.object({}).strict(),
    keys: async (_scope: Record<string, never>, viewer: LiveViewer) => [viewer.accessSubject],
    authorize: async (_key: string, viewers: readonly LiveViewer[]) => viewers.map((v) => v.id),
  },
};

export const handler: LiveHandler = inventoryLive.routes(channels, {
  secret: "from hook_secret_file",
  authenticate: async ({ headers }) =>
    headers.cookie ? { viewer: { id: "user:ada", actor: "user:ada", accessSubject: "user:ada", scopes: null }, expiresInS: 60 } : { refused: "no session" },
});
export const section = inventoryLive.replicaConfig(channels, { url: "http://127.0.0.1:3000/outlive/hooks" });
export const url: string = section.channels.warehouse!.hook.url;
export const cursor: Promise<string> = inventoryLive.cursor({ url: "http://127.0.0.1:8080" });
