// The inventory demo's app server in TypeScript (issue 44 item 3): the same page, the same JSON
// routes and the same sign-in as the C++ inventory_demo (examples/inventory/main.cpp), written with
// node:http, node-postgres and @outlive/server:
//
// - its routes write with inventoryLive.publish(tx, ...) / publishAccess(tx, ...) inside their own
//   node-postgres transaction, and wake() the replicas after the commit;
// - the replica's channels `warehouse` and `my_warehouses` are hook channels: the replica asks this
//   server's routes() handler (keys, authorize; signed with the replica's hook_secret_file) instead
//   of running SQL of its own.
//
//   node dist/server.js serve --listen 127.0.0.1:PORT --database URL --static DIR --client FILE
//                             --replicas http://127.0.0.1:P1[,http://127.0.0.1:P2] --hook-secret-file FILE
//                             [--hooks-listen 127.0.0.1:PORT]
//   node dist/server.js replica-config --hook-url URL [--event-schema PATH] [--out FILE]
//
// `serve`: the app. `--replicas`: where GET /api/inventory/live/cursor is read (the first that
// answers). `--hooks-listen`: routes() on its own loopback port, out of the gateway's reach
// (without it, at POST /outlive/hooks of --listen; the signature guards it either way).
// `replica-config`: prints apps.inventory of the replica's configuration, from replicaConfig():
// the channels' scopes as JSON Schema and their hook URL (outlive_demo_run --app-server ts writes
// it into <data>/replica-N.json).
//
// Routes (the gateway sends /api/inventory/live and /api/inventory/live/cursor to the replicas):
//   GET  /  /app.js  /style.css  /outlive.js  /healthz
//   POST /api/signin  /api/signout      GET /api/me
//   GET  /api/warehouses                {"cursor", "warehouses", "others"}
//   GET  /api/warehouses/<public_id>    {"cursor", "warehouse", "items"}: the cursor read FIRST
//   POST /api/items/<short_id>/quantity {"quantity": n}: UPDATE + publish(tx) + COMMIT + wake()
//   POST /api/items/<short_id>/name     {"name": s}: the trigger path (events.enqueue); wake() only
//   POST /api/warehouses/<public_id>/members/remove|add  {"subject"}: publishAccess(tx)
import { createHash, randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import path from "node:path";
import pg from "pg";
import { z } from "zod";
import { channel, defineLive, LiveValidationError, type LiveViewer } from "@outlive/server";

const APP = "inventory";
const DEMO_SUBJECT = "user:ada";
const SESSION_COOKIE = "session";
const HOOK_PATH = "/outlive/hooks";
const MAX_BODY_BYTES = 64 * 1024;

// ---- the live updates and the channels ----------------------------------------------------------

/** schemas/inventory.event.json as zod: what publish() checks before it writes. */
export const inventoryLive = defineLive({
  appId: APP,
  event: z.discriminatedUnion("type", [
    z
      .object({
        type: z.literal("item.changed"),
        itemId: z.string().min(1),
        quantity: z.number().int().min(0).optional(),
      })
      .strict(),
    z.object({ type: z.literal("item.deleted"), itemId: z.string().min(1) }).strict(),
  ]),
});

let pool: pg.Pool | null = null;
function db(): pg.Pool {
  if (!pool) throw new Error("no database (serve --database URL)");
  return pool;
}

/** The viewers (up to 500 at once) who are members of the warehouse `key`: the demo's one rule. */
async function readersOfWarehouse(key: string, viewers: readonly LiveViewer[]): Promise<string[]> {
  const r = await db().query<{ id: string }>(
    "SELECT v->>'id' AS id FROM jsonb_array_elements($2::text::jsonb) v" +
      " JOIN inventory.members m ON m.warehouse_id = $1::uuid AND m.subject = v->>'accessSubject'",
    [key, JSON.stringify(viewers)],
  );
  return r.rows.map((row) => row.id);
}

/** The same two channels as examples/inventory/outlive.json's SQL, answered here (SPEC 5.4). */
export const inventoryChannels = {
  warehouse: channel({
    scope: z.object({ warehouse: z.string() }).strict(),
    keys: async ({ warehouse }) => {
      const r = await db().query<{ key: string }>(
        "SELECT id::text AS key FROM inventory.warehouses WHERE public_id = $1",
        [warehouse],
      );
      return r.rows.length ? [r.rows[0]!.key] : null; // null: not_found
    },
    authorize: readersOfWarehouse,
  }),
  my_warehouses: channel({
    collection: true,
    scope: z.object({}).strict(),
    keys: async (_scope, viewer) => {
      const r = await db().query<{ key: string }>(
        "SELECT warehouse_id::text AS key FROM inventory.members WHERE subject = $1",
        [viewer.accessSubject],
      );
      return r.rows.map((row) => row.key);
    },
    authorize: readersOfWarehouse,
  }),
};

// ---- HTTP plumbing ------------------------------------------------------------------------------

interface Reply {
  status: number;
  type?: string;
  body: string | Buffer;
  headers?: Record<string, string>;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

function json(status: number, body: unknown, headers?: Record<string, string>): Reply {
  return { status, type: "application/json", body: JSON.stringify(body), headers };
}

function fail(status: number, code: string, message: string): Reply {
  return json(status, { error: code, message });
}

const unauthorized = () => fail(401, "unauthorized", "sign in first (POST /api/signin)");

function log(level: "info" | "warn" | "error", msg: string, fields: Record<string, unknown> = {}) {
  const line = JSON.stringify({ ts: new Date().toISOString(), level, msg, app: APP, ...fields });
  (level === "info" ? process.stdout : process.stderr).write(line + "\n");
}

async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limit) throw new HttpError(413, "too_large", `body above ${limit} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

class AppRequest {
  constructor(
    readonly method: string,
    readonly path: string,
    private readonly raw: IncomingMessage,
    readonly body: Buffer,
  ) {}

  header(name: string): string {
    const v = this.raw.headers[name.toLowerCase()];
    return Array.isArray(v) ? (v[0] ?? "") : (v ?? "");
  }

  cookie(name: string): string {
    for (const part of this.header("cookie").split(";")) {
      const eq = part.indexOf("=");
      if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
    }
    return "";
  }

  /** The JSON object of the body ({} when empty), or null. */
  jsonObject(): Record<string, unknown> | null {
    try {
      const v: unknown = JSON.parse(this.body.length ? this.body.toString("utf8") : "{}");
      return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
    } catch {
      return null;
    }
  }
}

type Queryable = Pick<pg.PoolClient, "query">;

/** `fn` inside BEGIN ... COMMIT on one pooled client (ROLLBACK when it throws). */
async function transaction<T>(fn: (tx: pg.PoolClient) => Promise<T>, begin = "BEGIN"): Promise<T> {
  const client = await db().connect();
  try {
    await client.query(begin);
    const result = await fn(client);
    await client.query("COMMIT");
    return result;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    client.release();
  }
}

/** After the commit: the replicas publish now. The update is committed either way. */
async function wake(): Promise<void> {
  try {
    await inventoryLive.wake(db());
  } catch (e) {
    log("warn", "wake failed (the replicas publish at their next poll)", { error: String(e) });
  }
}

// ---- the app ------------------------------------------------------------------------------------

interface Options {
  listen: string;
  hooksListen: string;
  database: string;
  staticDir: string;
  client: string;
  replicas: string[];
  hookSecretFile: string;
}

function hostPort(value: string, what: string): [string, number] {
  const colon = value.lastIndexOf(":");
  const port = Number(value.slice(colon + 1));
  if (colon < 1 || !Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`${what} must be HOST:PORT`);
  return [value.slice(0, colon), port];
}

class App {
  private nextReplica = 0;

  constructor(private readonly o: Options) {}

  /** SPEC 5.6 cursor(): from a replica; the next one when one does not answer (it may be stopping). */
  async cursor(): Promise<string> {
    let last: unknown;
    for (let i = 0; i < this.o.replicas.length; i++) {
      const url = this.o.replicas[(this.nextReplica + i) % this.o.replicas.length]!;
      try {
        const c = await inventoryLive.cursor({ url, signal: AbortSignal.timeout(3000) });
        this.nextReplica = (this.nextReplica + i) % this.o.replicas.length;
        return c;
      } catch (e) {
        last = e;
      }
    }
    throw new HttpError(503, "unavailable", `no replica answered the cursor: ${String(last)}`);
  }

  /** The signed-in subject: the session cookie, or ada's API key as a Bearer token. */
  async viewerSubject(tx: Queryable, req: AppRequest): Promise<string | null> {
    const token = req.cookie(SESSION_COOKIE);
    if (token) {
      const r = await tx.query<{ subject: string }>(
        "SELECT subject FROM auth.sessions WHERE token_sha256 = encode(sha256(convert_to($1, 'UTF8')), 'hex')" +
          " AND expires_at > now()",
        [token],
      );
      if (r.rows.length) return r.rows[0]!.subject;
    }
    const authorization = req.header("authorization");
    if (authorization.startsWith("Bearer ")) {
      const r = await tx.query<{ subject: string }>(
        "SELECT subject FROM auth.api_keys WHERE key_sha256 = encode(sha256(convert_to($1, 'UTF8')), 'hex')" +
          " AND revoked_at IS NULL",
        [authorization.slice(7)],
      );
      if (r.rows.length) return r.rows[0]!.subject;
    }
    return null;
  }

  async file(name: string, type: string): Promise<Reply> {
    try {
      return { status: 200, type, body: await readFile(name) };
    } catch {
      return fail(404, "not_found", "no such file");
    }
  }

  async route(req: AppRequest): Promise<Reply> {
    const parts = req.path.split("/").filter((p) => p.length > 0).map(decodeURIComponent);
    const get = req.method === "GET";
    const post = req.method === "POST";
    if (get) {
      if (req.path === "/" || req.path === "/index.html") {
        return this.file(path.join(this.o.staticDir, "index.html"), "text/html; charset=utf-8");
      }
      if (req.path === "/app.js") return this.file(path.join(this.o.staticDir, "app.js"), "text/javascript; charset=utf-8");
      if (req.path === "/style.css") return this.file(path.join(this.o.staticDir, "style.css"), "text/css; charset=utf-8");
      if (req.path === "/outlive.js") return this.file(this.o.client, "text/javascript; charset=utf-8");
      if (req.path === "/healthz") return { status: 200, type: "text/plain", body: "ok\n" };
      if (req.path === "/favicon.ico") return { status: 204, body: "" };
    }
    if (parts[0] !== "api") return fail(404, "not_found", `no route ${req.path}`);
    // Writes come from the page's fetch() with a JSON body (a cross-site form cannot send that).
    if (post && !req.header("content-type").startsWith("application/json")) {
      return fail(415, "invalid_input", "send Content-Type: application/json");
    }
    const [, a, b, c, d] = parts;
    if (parts.length === 2 && a === "signin" && post) return this.signin();
    if (parts.length === 2 && a === "signout" && post) return this.signout(req);
    if (parts.length === 2 && a === "me" && get) return this.me(req);
    if (parts.length === 2 && a === "warehouses" && get) return this.myWarehouses(req);
    if (parts.length === 3 && a === "warehouses" && get) return this.warehouse(req, b!);
    if (parts.length === 4 && a === "items" && c === "quantity" && post) return this.setQuantity(req, b!);
    if (parts.length === 4 && a === "items" && c === "name" && post) return this.rename(req, b!);
    if (parts.length === 5 && a === "warehouses" && c === "members" && post && (d === "add" || d === "remove")) {
      return this.changeMember(req, b!, d === "add");
    }
    return fail(404, "not_found", `no route ${req.method} ${req.path}`);
  }

  // The demo's one-click sign-in: a session row for ada; only the token's SHA-256 is stored. The
  // replicas look the same cookie up with outlive.json's `sessions` query.
  async signin(): Promise<Reply> {
    const token = randomBytes(32).toString("hex");
    await db().query(
      "INSERT INTO auth.sessions (token_sha256, subject, actor, app_session, expires_at)" +
        " VALUES ($1, $2, $2, false, now() + interval '12 hours')",
      [createHash("sha256").update(token, "utf8").digest("hex"), DEMO_SUBJECT],
    );
    return json(200, { subject: DEMO_SUBJECT }, {
      "set-cookie": `${SESSION_COOKIE}=${token}; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200`,
    });
  }

  async signout(req: AppRequest): Promise<Reply> {
    const token = req.cookie(SESSION_COOKIE);
    if (token) {
      await db().query("DELETE FROM auth.sessions WHERE token_sha256 = $1", [
        createHash("sha256").update(token, "utf8").digest("hex"),
      ]);
    }
    return json(200, { signedOut: true }, { "set-cookie": `${SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0` });
  }

  async me(req: AppRequest): Promise<Reply> {
    const subject = await this.viewerSubject(db(), req);
    return subject ? json(200, { subject }) : unauthorized();
  }

  // The collection snapshot behind channel my_warehouses. Cursor first, then the snapshot.
  async myWarehouses(req: AppRequest): Promise<Reply> {
    const subject = await this.viewerSubject(db(), req);
    if (!subject) return unauthorized();
    const cursor = await this.cursor();
    return transaction(async (tx) => {
      const mine = await tx.query<{ public_id: string; name: string; items: string }>(
        "SELECT w.public_id, w.name, (SELECT count(*) FROM inventory.items i WHERE i.warehouse_id = w.id) AS items" +
          " FROM inventory.warehouses w JOIN inventory.members m ON m.warehouse_id = w.id AND m.subject = $1" +
          " ORDER BY w.public_id",
        [subject],
      );
      const warehouses = mine.rows.map((r) => ({ publicId: r.public_id, name: r.name, items: Number(r.items) }));
      const all = await tx.query<{ public_id: string; name: string }>(
        "SELECT public_id, name FROM inventory.warehouses ORDER BY public_id",
      );
      const others = all.rows
        .filter((r) => !warehouses.some((w) => w.publicId === r.public_id))
        .map((r) => ({ publicId: r.public_id, name: r.name }));
      return json(200, { cursor, warehouses, others });
    }, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  }

  // SPEC 5.6: the cursor FIRST, then the snapshot in one repeatable-read transaction, so a change
  // made while the snapshot loads reaches the tab afterwards (the page applies updates idempotently).
  async warehouse(req: AppRequest, publicId: string): Promise<Reply> {
    const subject = await this.viewerSubject(db(), req);
    if (!subject) return unauthorized();
    const cursor = await this.cursor();
    return transaction(async (tx) => {
      const w = await tx.query<{ id: string; public_id: string; name: string }>(
        "SELECT id::text, public_id, name FROM inventory.warehouses WHERE public_id = $1",
        [publicId],
      );
      const row = w.rows[0];
      if (!row) return fail(404, "not_found", `no warehouse ${publicId}`);
      // The channels' rule (readersOfWarehouse) decides the snapshot too.
      const member = await tx.query(
        "SELECT 1 FROM inventory.members WHERE warehouse_id = $1::uuid AND subject = $2",
        [row.id, subject],
      );
      if (member.rows.length === 0) return fail(403, "forbidden", `${subject} is not a member of warehouse ${publicId}`);
      const items = await tx.query<{ short_id: string; name: string; quantity: number }>(
        "SELECT short_id, name, quantity FROM inventory.items WHERE warehouse_id = $1::uuid ORDER BY short_id",
        [row.id],
      );
      return json(200, {
        cursor,
        warehouse: { publicId: row.public_id, name: row.name },
        items: items.rows.map((i) => ({ id: i.short_id, name: i.name, quantity: i.quantity })),
      });
    }, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  }

  /** The item, locked, and whether `subject` may change it; null: no such item. */
  async lockItem(tx: pg.PoolClient, shortId: string, subject: string) {
    const r = await tx.query<{ warehouse_id: string; member: boolean; quantity: number; name: string }>(
      "SELECT i.warehouse_id::text AS warehouse_id," +
        " EXISTS (SELECT 1 FROM inventory.members m WHERE m.warehouse_id = i.warehouse_id AND m.subject = $2) AS member," +
        " i.quantity, i.name FROM inventory.items i WHERE i.short_id = $1 FOR UPDATE OF i",
      [shortId, subject],
    );
    return r.rows[0] ?? null;
  }

  // SPEC 2.2: the change and its live update in one transaction; wake() after the commit.
  async setQuantity(req: AppRequest, shortId: string): Promise<Reply> {
    const body = req.jsonObject();
    const quantity = body?.quantity;
    if (typeof quantity !== "number" || !Number.isInteger(quantity)) {
      return fail(400, "invalid_input", 'send {"quantity": <integer >= 0>}');
    }
    if (quantity < 0 || quantity > 2147483647) return fail(400, "invalid_input", "quantity must be 0 or more");
    let changed = false;
    const reply = await transaction(async (tx) => {
      const subject = await this.viewerSubject(tx, req);
      if (!subject) return unauthorized();
      const item = await this.lockItem(tx, shortId, subject);
      if (!item) return fail(404, "not_found", `no item ${shortId}`);
      if (!item.member) return fail(403, "forbidden", `${subject} may not change item ${shortId}`);
      // Publish only when the transaction changes something.
      if (item.quantity === quantity) return json(200, { itemId: shortId, quantity, changed: false });
      await tx.query("UPDATE inventory.items SET quantity = $1 WHERE short_id = $2", [quantity, shortId]);
      await inventoryLive.publish(tx, {
        key: item.warehouse_id,
        data: { type: "item.changed", itemId: shortId, quantity },
      });
      changed = true;
      return json(200, { itemId: shortId, quantity, changed: true });
    });
    if (changed) await wake();
    return reply;
  }

  // The trigger path: the UPDATE fires inventory.publish_item_change() (schema.sql), which writes
  // the live update through events.enqueue in this same transaction. The app only wakes.
  async rename(req: AppRequest, shortId: string): Promise<Reply> {
    const name = req.jsonObject()?.name;
    if (typeof name !== "string") return fail(400, "invalid_input", 'send {"name": <text>}');
    if (name.length === 0 || Buffer.byteLength(name) > 200) return fail(400, "invalid_input", "name: 1 to 200 characters");
    let changed = false;
    const reply = await transaction(async (tx) => {
      const subject = await this.viewerSubject(tx, req);
      if (!subject) return unauthorized();
      const item = await this.lockItem(tx, shortId, subject);
      if (!item) return fail(404, "not_found", `no item ${shortId}`);
      if (!item.member) return fail(403, "forbidden", `${subject} may not change item ${shortId}`);
      if (item.name === name) return json(200, { itemId: shortId, name, changed: false });
      await tx.query("UPDATE inventory.items SET name = $1 WHERE short_id = $2", [name, shortId]);
      changed = true;
      return json(200, { itemId: shortId, name, changed: true });
    });
    if (changed) await wake();
    return reply;
  }

  // SPEC 2.3: a change of who may read the warehouse publishes an access update for its key in the
  // same transaction; every replica asks authorize() (this server's hook) again before it delivers
  // anything later, and a removed member's tab receives `revoked`.
  // (A demo shortcut: any signed-in user may change the members.)
  async changeMember(req: AppRequest, publicId: string, add: boolean): Promise<Reply> {
    const member = req.jsonObject()?.subject;
    if (typeof member !== "string") return fail(400, "invalid_input", 'send {"subject": "user:<id>"}');
    if (member.length === 0 || Buffer.byteLength(member) > 200) return fail(400, "invalid_input", "subject: 1 to 200 characters");
    let changed = false;
    let by = "";
    const reply = await transaction(async (tx) => {
      const subject = await this.viewerSubject(tx, req);
      if (!subject) return unauthorized();
      by = subject;
      const w = await tx.query<{ id: string }>(
        "SELECT id::text FROM inventory.warehouses WHERE public_id = $1 FOR UPDATE",
        [publicId],
      );
      const warehouseId = w.rows[0]?.id;
      if (!warehouseId) return fail(404, "not_found", `no warehouse ${publicId}`);
      const r = add
        ? await tx.query(
            "INSERT INTO inventory.members (warehouse_id, subject) VALUES ($1::uuid, $2) ON CONFLICT DO NOTHING",
            [warehouseId, member],
          )
        : await tx.query("DELETE FROM inventory.members WHERE warehouse_id = $1::uuid AND subject = $2", [
            warehouseId,
            member,
          ]);
      if (!r.rowCount) return json(200, { warehouse: publicId, subject: member, changed: false });
      await inventoryLive.publishAccess(tx, warehouseId);
      changed = true;
      return json(200, { warehouse: publicId, subject: member, changed: true });
    });
    if (changed) {
      await wake();
      log("info", add ? "member added" : "member removed", { warehouse: publicId, subject: member, by });
    }
    return reply;
  }

  async handle(req: AppRequest): Promise<Reply> {
    try {
      return await this.route(req);
    } catch (e) {
      if (e instanceof HttpError) return fail(e.status, e.code, e.message);
      if (e instanceof URIError) return fail(400, "invalid_input", `a malformed path: ${req.path}`);
      if (e instanceof LiveValidationError) return fail(400, "invalid_input", e.message);
      const code = (e as { code?: unknown }).code;
      // Connection refused/reset, or Postgres shutting down (class 57P, 08).
      if (code === "ECONNREFUSED" || code === "ECONNRESET" || (typeof code === "string" && /^(08|57P)/.test(code))) {
        log("error", String(e), { path: req.path });
        return fail(503, "unavailable", "the database is unavailable");
      }
      log("error", String((e as Error)?.stack ?? e), { path: req.path });
      return fail(500, "internal", String((e as Error)?.message ?? e));
    }
  }
}

// ---- node:http <-> Fetch ------------------------------------------------------------------------

function send(res: ServerResponse, reply: Reply) {
  const headers: Record<string, string> = { "cache-control": "no-store", ...(reply.headers ?? {}) };
  if (reply.type) headers["content-type"] = reply.type;
  res.writeHead(reply.status, headers);
  res.end(reply.body);
}

/** routes()'s handler behind node:http: the IncomingMessage as a Request, the Response written back. */
function hookListener(handler: (request: Request) => Promise<Response>) {
  return async (req: IncomingMessage, res: ServerResponse) => {
    try {
      const headers = new Headers();
      for (const [name, value] of Object.entries(req.headers)) {
        if (Array.isArray(value)) value.forEach((v) => headers.append(name, v));
        else if (value !== undefined) headers.set(name, value);
      }
      const hasBody = req.method !== "GET" && req.method !== "HEAD";
      const body = hasBody ? new Uint8Array(await readBody(req, 4 * 1024 * 1024)) : undefined;
      const response = await handler(
        new Request(`http://${req.headers.host ?? "localhost"}${req.url ?? "/"}`, {
          method: req.method,
          headers,
          body,
        }),
      );
      res.writeHead(response.status, Object.fromEntries(response.headers));
      res.end(Buffer.from(await response.arrayBuffer()));
    } catch (e) {
      const status = e instanceof HttpError ? e.status : 500;
      send(res, fail(status, "internal", String((e as Error)?.message ?? e)));
    }
  };
}

function listen(server: Server, address: string, what: string): Promise<number> {
  const [host, port] = hostPort(address, what);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const a = server.address();
      resolve(typeof a === "object" && a ? a.port : port);
    });
  });
}

// ---- the command line ---------------------------------------------------------------------------

const USAGE = `usage: node dist/server.js serve --listen HOST:PORT --database URL --static DIR --client FILE
                                --replicas URL[,URL...] --hook-secret-file FILE [--hooks-listen HOST:PORT]
       node dist/server.js replica-config --hook-url URL [--event-schema PATH] [--timeout-ms N] [--out FILE]
`;

function flags(args: string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (!a.startsWith("--") || i + 1 >= args.length) throw new Error(`bad argument ${a}`);
    out.set(a.slice(2), args[++i]!);
  }
  return out;
}

function need(f: Map<string, string>, name: string): string {
  const v = f.get(name);
  if (!v) throw new Error(`--${name} is required`);
  return v;
}

async function serve(f: Map<string, string>) {
  const o: Options = {
    listen: need(f, "listen"),
    hooksListen: f.get("hooks-listen") ?? "",
    database: need(f, "database"),
    staticDir: need(f, "static"),
    client: need(f, "client"),
    replicas: need(f, "replicas").split(",").filter((u) => u.length > 0),
    hookSecretFile: need(f, "hook-secret-file"),
  };
  // The replica trims one trailing newline from hook_secret_file: so does this.
  const secret = readFileSync(o.hookSecretFile, "utf8").replace(/\r?\n$/, "");
  readFileSync(path.join(o.staticDir, "index.html"));
  // Connections stay open (as the C++ app's pool keeps them): a new one per request after an idle
  // pause would add Postgres's connection start to the next write's latency.
  pool = new pg.Pool({ connectionString: o.database, max: 8, idleTimeoutMillis: 0 });
  pool.on("error", (e) => log("warn", "idle database connection failed", { error: String(e) }));

  const app = new App(o);
  const hooks = hookListener(
    inventoryLive.routes(inventoryChannels, {
      secret,
      onError: (e) => log("error", String((e as Error)?.message ?? e)),
    }),
  );
  const main = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://app");
    if (!o.hooksListen && url.pathname === HOOK_PATH) return hooks(req, res);
    let reply: Reply;
    try {
      const body = req.method === "POST" ? await readBody(req, MAX_BODY_BYTES) : Buffer.alloc(0);
      reply = await app.handle(new AppRequest(req.method ?? "GET", url.pathname, req, body));
    } catch (e) {
      reply = e instanceof HttpError ? fail(e.status, e.code, e.message) : fail(400, "invalid_input", String(e));
    }
    send(res, reply);
  });
  const servers = [main];
  const port = await listen(main, o.listen, "--listen");
  let hooksAt = `${o.listen.replace(/:\d+$/, "")}:${port}${HOOK_PATH}`;
  if (o.hooksListen) {
    const hookServer = createServer((req, res) => {
      if (new URL(req.url ?? "/", "http://app").pathname !== HOOK_PATH) {
        send(res, fail(404, "not_found", `hooks are at ${HOOK_PATH}`));
        return;
      }
      void hooks(req, res);
    });
    servers.push(hookServer);
    const hp = await listen(hookServer, o.hooksListen, "--hooks-listen");
    hooksAt = `${o.hooksListen.replace(/:\d+$/, "")}:${hp}${HOOK_PATH}`;
  }
  log("info", "inventory demo (TypeScript) listening", { listen: `${o.listen.replace(/:\d+$/, "")}:${port}`, hooks: hooksAt });

  const stop = (signal: string) => {
    log("info", "inventory demo (TypeScript) stopping", { signal });
    for (const s of servers) {
      s.close();
      s.closeAllConnections();
    }
    void pool?.end().finally(() => process.exit(0));
    setTimeout(() => process.exit(0), 2000).unref();
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
}

function replicaConfig(f: Map<string, string>) {
  const timeout = f.get("timeout-ms");
  const section = inventoryLive.replicaConfig(inventoryChannels, {
    url: need(f, "hook-url"),
    ...(timeout ? { timeoutMs: Number(timeout) } : {}),
    ...(f.get("event-schema") ? { eventSchema: f.get("event-schema")! } : {}),
  });
  const text = JSON.stringify(section, null, 2) + "\n";
  const out = f.get("out");
  if (out) writeFileSync(out, text);
  else process.stdout.write(text);
}

async function main(argv: string[]) {
  const [command, ...rest] = argv;
  if (command === "--help" || command === "-h") {
    process.stdout.write(USAGE);
    return;
  }
  try {
    if (command === "serve") await serve(flags(rest));
    else if (command === "replica-config") replicaConfig(flags(rest));
    else throw new Error(`unknown command ${command ?? "(none)"}`);
  } catch (e) {
    process.stderr.write(`inventory-ts: ${(e as Error)?.message ?? e}\n${USAGE}`);
    process.exit(2);
  }
}

await main(process.argv.slice(2));
