// @outlive/server: the server side of outlive live updates for Node 20+ (SPEC 2.2 "TypeScript",
// docs/TYPESCRIPT.md). Plain ESM with hand-written declarations in index.d.ts.
//
// - defineLive({appId, event}) -> live
// - live.publish(tx, {key, data, access?, coalesceKey?}) / live.publishAccess(tx, key, data?):
//   inside the caller's transaction (node-postgres client inside BEGIN, or postgres.js's
//   sql.begin(tx)), through events.publish_live (sql/005_writers.sql).
// - live.wake(db), live.cursor({url})
// - live.routes(channels, {secret, authenticate?}): a Fetch-API handler for the replica's hooks
//   (SPEC 5.1, 5.4), signed with Outlive-Signature.
// - live.replicaConfig(channels, {url}): the app's section of the replica configuration.
import { createHmac, timingSafeEqual } from "node:crypto";
import { z } from "zod";

export const SIGNATURE_HEADER = "Outlive-Signature";
/** Seconds a hook request's `t` may be off the application's clock, either way (SPEC 5.1). */
export const SIGNATURE_TOLERANCE_S = 300;
/** A key has 1 to 600 characters (SPEC 2.1). */
export const MAX_KEY_CHARS = 600;
/** Data whose JSON text is larger is published as a resync (SPEC 2.1): not an error. */
export const MAX_DATA_BYTES = 32 * 1024;
/** At most this many bytes of a hook request body are read. */
export const MAX_HOOK_BODY_BYTES = 4 * 1024 * 1024;

const APP_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;
const CHANNEL_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

/** Thrown by publish() when `data` is not JSON or does not satisfy the event schema. */
export class LiveValidationError extends Error {
  constructor(message, issues = []) {
    super(message);
    this.name = "LiveValidationError";
    this.issues = issues;
  }
}

function pathText(path) {
  if (path.length === 0) return "data";
  return "data" + path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("");
}

function isPlainObject(value) {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

// Lone surrogates and U+0000 pass JSON.stringify but jsonb refuses them: the statement would fail
// inside the caller's transaction. Checked here, before any SQL.
const UNSTORABLE_TEXT = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

// The issues that make `value` something JSON cannot carry as it is: what JSON.stringify would
// change, drop, turn into null or refuse. Undefined object properties are dropped by JSON as by
// every JSON API, so they are allowed; undefined anywhere else is not.
function jsonIssues(value, path, out, ancestors) {
  if (out.length >= 20) return;
  const where = pathText(path);
  switch (typeof value) {
    case "string":
      if (UNSTORABLE_TEXT.test(value)) {
        out.push({ path, message: `${where}: a string with U+0000 or a lone surrogate, which Postgres jsonb cannot store` });
      }
      return;
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(value)) out.push({ path, message: `${where}: ${value} is not a JSON number` });
      return;
    case "bigint":
      out.push({ path, message: `${where}: a bigint is not JSON (send a string or a number)` });
      return;
    case "undefined":
      out.push({ path, message: `${where}: undefined is not JSON` });
      return;
    case "function":
    case "symbol":
      out.push({ path, message: `${where}: a ${typeof value} is not JSON` });
      return;
  }
  if (value === null) return;
  if (ancestors.includes(value)) {
    out.push({ path, message: `${where}: a circular reference` });
    return;
  }
  if (Array.isArray(value)) {
    if (Object.getPrototypeOf(value) !== Array.prototype) {
      out.push({ path, message: `${where}: an instance of ${value.constructor?.name ?? "a subclass of Array"}, not a plain array` });
      return;
    }
    ancestors.push(value);
    for (let i = 0; i < value.length; i++) {
      if (!(i in value)) {
        out.push({ path: [...path, i], message: `${pathText([...path, i])}: a hole in an array is not JSON` });
        continue;
      }
      jsonIssues(value[i], [...path, i], out, ancestors);
    }
    ancestors.pop();
    return;
  }
  if (value instanceof Date) {
    out.push({ path, message: `${where}: a Date is not JSON (send an ISO string: date.toISOString())` });
    return;
  }
  if (!isPlainObject(value)) {
    out.push({ path, message: `${where}: an instance of ${value.constructor?.name ?? "a class"}, not a plain object` });
    return;
  }
  if (typeof value.toJSON === "function") {
    out.push({ path, message: `${where}: an object with toJSON(), which JSON would replace` });
    return;
  }
  if (Object.getOwnPropertySymbols(value).some((s) => Object.prototype.propertyIsEnumerable.call(value, s))) {
    out.push({ path, message: `${where}: symbol keys are not JSON` });
  }
  ancestors.push(value);
  for (const k of Object.keys(value)) {
    const v = value[k];
    if (v === undefined) continue;
    if (UNSTORABLE_TEXT.test(k)) {
      out.push({ path: [...path, k], message: `${pathText([...path, k])}: a key with U+0000 or a lone surrogate` });
    }
    jsonIssues(v, [...path, k], out, ancestors);
  }
  ancestors.pop();
}

function checkKey(key, what) {
  if (typeof key !== "string") throw new TypeError(`${what}: key must be a string, not ${typeof key}`);
  const chars = [...key].length;
  if (chars < 1 || chars > MAX_KEY_CHARS) {
    throw new RangeError(`${what}: key must have 1 to ${MAX_KEY_CHARS} characters (it has ${chars})`);
  }
}

// The transaction's kind, by duck typing: postgres.js's sql/tx is a tagged-template function with
// .unsafe(); node-postgres's Client/PoolClient has .query().
function driverOf(db, what, { allowPool }) {
  if (typeof db === "function" && typeof db.unsafe === "function") {
    if (!allowPool && typeof db.begin === "function") {
      throw new TypeError(
        `${what}: pass the transaction of sql.begin(async (tx) => ...), not the postgres.js sql object ` +
          "(a publish outside a transaction would commit on its own)",
      );
    }
    return {
      run: (text, params) => db.unsafe(text, params),
    };
  }
  if (db && typeof db === "object" && typeof db.query === "function") {
    if (!allowPool && typeof db.totalCount === "number" && typeof db.idleCount === "number") {
      throw new TypeError(
        `${what}: pass a client inside BEGIN (const client = await pool.connect(); await client.query("BEGIN")), ` +
          "not a pg Pool (a publish through a pool would commit on its own)",
      );
    }
    return {
      run: (text, params) => db.query(text, params),
    };
  }
  throw new TypeError(`${what}: expected a node-postgres client or a postgres.js transaction`);
}

// Typed parameters: the data goes as text cast to jsonb, so neither driver serialises it again
// (postgres.js would JSON-encode a string sent for a jsonb parameter).
const PUBLISH_SQL =
  "SELECT events.publish_live($1::text, $2::text, $3::text::jsonb, $4::boolean, $5::text)";
const WAKE_SQL = "SELECT events.wake($1::text)";

function isZodSchema(s) {
  return s !== null && typeof s === "object" && typeof s.safeParse === "function";
}

export function defineLive(options) {
  const { appId, event } = options ?? {};
  if (typeof appId !== "string" || !APP_ID.test(appId)) {
    throw new TypeError(`defineLive: appId must match ${APP_ID.source} (got ${JSON.stringify(appId)})`);
  }
  if (!isZodSchema(event)) throw new TypeError("defineLive: event must be a zod schema");

  // The JSON text of `data` after checking it is JSON and satisfies `event` in its JSON form.
  function jsonOf(data, what) {
    const issues = [];
    jsonIssues(data, [], issues, []);
    if (issues.length) {
      throw new LiveValidationError(`${what}: ${issues.map((i) => i.message).join("; ")}`, issues);
    }
    const text = JSON.stringify(data);
    const result = event.safeParse(JSON.parse(text));
    if (!result.success) {
      const zodIssues = result.error.issues;
      const described = zodIssues
        .slice(0, 10)
        .map((i) => `${pathText(i.path ?? [])}: ${i.message}`)
        .join("; ");
      throw new LiveValidationError(`${what}: data does not match the event schema of "${appId}": ${described}`, zodIssues);
    }
    return text;
  }

  async function publish(tx, update) {
    const what = `publish("${appId}")`;
    if (update === null || typeof update !== "object") throw new TypeError(`${what}: expected {key, data, access?, coalesceKey?}`);
    const { key, data, access = false, coalesceKey = null } = update;
    checkKey(key, what);
    if (typeof access !== "boolean") throw new TypeError(`${what}: access must be a boolean`);
    if (coalesceKey !== null && coalesceKey !== undefined) {
      if (typeof coalesceKey !== "string") throw new TypeError(`${what}: coalesceKey must be a string`);
      if ([...coalesceKey].length > MAX_KEY_CHARS) {
        throw new RangeError(`${what}: coalesceKey must have at most ${MAX_KEY_CHARS} characters`);
      }
    }
    const hasData = data !== undefined;
    if (!hasData && !access) {
      throw new LiveValidationError(`${what}: data is required (or access: true for an access update)`, [
        { path: [], message: "data: required" },
      ]);
    }
    const text = hasData ? jsonOf(data, what) : null;
    const driver = driverOf(tx, what, { allowPool: false });
    await driver.run(PUBLISH_SQL, [appId, key, text, access, coalesceKey ?? null]);
  }

  function publishAccess(tx, key, data) {
    return publish(tx, data === undefined ? { key, access: true } : { key, data, access: true });
  }

  async function wake(db) {
    const driver = driverOf(db, `wake("${appId}")`, { allowPool: true });
    await driver.run(WAKE_SQL, [appId]);
  }

  async function cursor(opts) {
    const { url, headers, signal } = opts ?? {};
    const doFetch = opts?.fetch ?? globalThis.fetch;
    if (typeof url !== "string" || !/^https?:\/\//.test(url)) {
      throw new TypeError(`cursor("${appId}"): url must be the replica's http(s) base URL`);
    }
    const target = url.replace(/\/+$/, "") + `/api/${appId}/live/cursor`;
    const response = await doFetch(target, { method: "GET", headers, signal });
    const text = await response.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      // reported below
    }
    if (response.status !== 200 || !body || typeof body.cursor !== "string") {
      const detail = body && typeof body.error === "string" ? `${body.error}: ${body.message ?? ""}` : text.slice(0, 200);
      const error = new Error(`cursor("${appId}"): GET ${target} answered ${response.status}: ${detail}`);
      error.status = response.status;
      throw error;
    }
    return body.cursor;
  }

  function routes(channels, opts) {
    return makeRoutes(appId, checkChannels(channels, "routes"), opts ?? {});
  }

  function replicaConfig(channels, opts) {
    return makeReplicaConfig(appId, checkChannels(channels, "replicaConfig"), opts ?? {});
  }

  function eventJsonSchema() {
    return jsonSchemaOf(event, `the event schema of "${appId}"`);
  }

  return Object.freeze({ appId, event, publish, publishAccess, wake, cursor, routes, replicaConfig, eventJsonSchema });
}

/** Types a channel's scope for keys(); returns the channel unchanged. */
export function channel(definition) {
  return definition;
}

function checkChannels(channels, what) {
  if (channels === null || typeof channels !== "object") throw new TypeError(`${what}: channels must be an object`);
  const out = new Map();
  for (const [name, ch] of Object.entries(channels)) {
    if (!CHANNEL_NAME.test(name)) throw new TypeError(`${what}: channel name "${name}" must match ${CHANNEL_NAME.source}`);
    if (!ch || !isZodSchema(ch.scope)) throw new TypeError(`${what}: channel "${name}": scope must be a zod schema`);
    if (typeof ch.keys !== "function") throw new TypeError(`${what}: channel "${name}": keys must be a function`);
    if (typeof ch.authorize !== "function") throw new TypeError(`${what}: channel "${name}": authorize must be a function`);
    if (ch.collection !== undefined && typeof ch.collection !== "boolean") {
      throw new TypeError(`${what}: channel "${name}": collection must be a boolean`);
    }
    out.set(name, ch);
  }
  return out;
}

function jsonSchemaOf(schema, what) {
  let json;
  try {
    json = z.toJSONSchema(schema, { target: "draft-07", io: "input" });
  } catch (e) {
    throw new TypeError(`${what} has no JSON Schema (${e.message}); use types JSON can carry`);
  }
  delete json.$schema;
  return json;
}

function makeReplicaConfig(appId, channels, opts) {
  const { url, timeoutMs, allowedOrigins, eventSchema } = opts;
  if (typeof url !== "string" || !/^https?:\/\//.test(url)) {
    throw new TypeError(`replicaConfig("${appId}"): url must be the http(s) URL where routes() is mounted`);
  }
  if (timeoutMs !== undefined && (!Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > 10000)) {
    throw new RangeError(`replicaConfig("${appId}"): timeoutMs must be an integer from 1 to 10000`);
  }
  const section = {};
  if (allowedOrigins !== undefined) section.allowed_origins = [...allowedOrigins];
  if (eventSchema !== undefined) section.event_schema = eventSchema;
  section.channels = {};
  for (const [name, ch] of channels) {
    const hook = { url };
    if (timeoutMs !== undefined) hook.timeout_ms = timeoutMs;
    const entry = {};
    if (ch.collection) entry.collection = true;
    entry.scope = jsonSchemaOf(ch.scope, `the scope of channel "${name}"`);
    entry.hook = hook;
    section.channels[name] = entry;
  }
  return section;
}

// ---- hooks -------------------------------------------------------------------------------------

function json(status, body) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", "cache-control": "no-store" },
  });
}

function hmacHex(secret, t, body) {
  return createHmac("sha256", secret).update(`${t}.`).update(body).digest("hex");
}

/** The Outlive-Signature header value for `body`, as the replica computes it (for tests and proxies). */
export function signHookBody(secret, body, t = Math.floor(Date.now() / 1000)) {
  return `t=${t},v1=${hmacHex(secret, t, body)}`;
}

/**
 * Checks an Outlive-Signature header: returns null when it is valid for `body`, else the reason.
 * `secret` may be a list (during a rotation, any of them).
 */
export function verifySignature(header, body, secret, { now = Date.now(), toleranceS = SIGNATURE_TOLERANCE_S } = {}) {
  if (typeof header !== "string" || header.length === 0) return "missing Outlive-Signature";
  let t = null;
  const signatures = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const name = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (name === "t") t = value;
    else if (name === "v1") signatures.push(value);
  }
  if (t === null || !/^[0-9]{1,12}$/.test(t)) return "Outlive-Signature without a valid t";
  if (signatures.length === 0) return "Outlive-Signature without v1";
  const age = Math.floor(now / 1000) - Number(t);
  if (age > toleranceS) return `Outlive-Signature t is ${age} s old (more than ${toleranceS} s)`;
  if (age < -toleranceS) return `Outlive-Signature t is ${-age} s in the future (more than ${toleranceS} s)`;
  const secrets = Array.isArray(secret) ? secret : [secret];
  let ok = false;
  for (const s of secrets) {
    const expected = Buffer.from(hmacHex(s, t, body), "utf8");
    for (const candidate of signatures) {
      const given = Buffer.from(candidate, "utf8");
      // timingSafeEqual needs equal lengths; a length mismatch says nothing about the secret.
      if (given.length === expected.length && timingSafeEqual(given, expected)) ok = true;
    }
  }
  return ok ? null : "Outlive-Signature does not match";
}

async function readBody(request, limit) {
  const declared = Number(request.headers.get("content-length"));
  if (Number.isFinite(declared) && declared > limit) return null;
  if (!request.body) return Buffer.alloc(0);
  const chunks = [];
  let size = 0;
  for await (const chunk of request.body) {
    size += chunk.byteLength;
    if (size > limit) return null;
    chunks.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
  }
  return Buffer.concat(chunks);
}

function isViewer(v) {
  return v !== null && typeof v === "object" && typeof v.id === "string" && v.id.length > 0;
}

function validKeys(keys) {
  return (
    Array.isArray(keys) &&
    keys.every((k) => typeof k === "string" && k.length > 0 && [...k].length <= MAX_KEY_CHARS)
  );
}

class ChannelError extends Error {}

function makeRoutes(appId, channels, opts) {
  const { secret, authenticate, onError = (e) => console.error(e), maxBodyBytes = MAX_HOOK_BODY_BYTES } = opts;
  const secrets = Array.isArray(secret) ? secret : [secret];
  if (secrets.length === 0 || !secrets.every((s) => (typeof s === "string" && s.length > 0) || s instanceof Uint8Array)) {
    throw new TypeError(`routes("${appId}"): secret must be the contents of the replica's hook_secret_file (a non-empty string)`);
  }
  if (authenticate !== undefined && typeof authenticate !== "function") {
    throw new TypeError(`routes("${appId}"): authenticate must be a function`);
  }
  const now = opts.now ?? (() => Date.now());

  async function call(what, fn) {
    try {
      return await fn();
    } catch (e) {
      if (e instanceof ChannelError) throw e;
      onError(Object.assign(new Error(`outlive hook "${appId}": ${what} threw: ${e?.message ?? e}`), { cause: e }));
      throw new ChannelError(`${what} threw`);
    }
  }

  async function keysOp(body) {
    const ch = Object.hasOwn(body, "channel") && typeof body.channel === "string" && channels.get(body.channel);
    if (!ch) return json(404, { error: "unknown_channel", message: `no channel ${JSON.stringify(body.channel)} in app "${appId}"` });
    if (!isViewer(body.viewer)) return json(400, { error: "invalid_request", message: "viewer must be an object with an id" });
    const parsed = ch.scope.safeParse(body.scope);
    // The replica checked the scope against the JSON Schema replicaConfig() printed; a zod rule JSON
    // Schema cannot say (a refine) ends here as "not found", never as a failed check to retry.
    if (!parsed.success) return json(200, { keys: null });
    const keys = await call(`channel "${body.channel}" keys()`, () => ch.keys(parsed.data, body.viewer));
    if (keys === null || keys === undefined) return json(200, { keys: null });
    if (!validKeys(keys)) {
      onError(new Error(`outlive hook "${appId}": channel "${body.channel}" keys() returned ${JSON.stringify(keys)?.slice(0, 200)}, not null or an array of keys (strings of 1 to ${MAX_KEY_CHARS} characters)`));
      throw new ChannelError("keys() returned a wrong type");
    }
    return json(200, { keys: [...new Set(keys)] });
  }

  async function authorizeOp(body) {
    const ch = typeof body.channel === "string" && channels.get(body.channel);
    if (!ch) return json(404, { error: "unknown_channel", message: `no channel ${JSON.stringify(body.channel)} in app "${appId}"` });
    if (typeof body.key !== "string" || body.key.length === 0) return json(400, { error: "invalid_request", message: "key must be a string" });
    if (!Array.isArray(body.viewers) || !body.viewers.every(isViewer)) {
      return json(400, { error: "invalid_request", message: "viewers must be an array of viewers with ids" });
    }
    if (body.viewers.length === 0) return json(200, { allowed: [] });
    const result = await call(`channel "${body.channel}" authorize()`, () => ch.authorize(body.key, body.viewers));
    if (!Array.isArray(result)) {
      onError(new Error(`outlive hook "${appId}": channel "${body.channel}" authorize() returned ${typeof result}, not an array of viewer ids`));
      throw new ChannelError("authorize() returned a wrong type");
    }
    const asked = new Set(body.viewers.map((v) => v.id));
    const allowed = new Set();
    for (const item of result) {
      const id = typeof item === "string" ? item : isViewer(item) ? item.id : null;
      if (id === null) {
        onError(new Error(`outlive hook "${appId}": channel "${body.channel}" authorize() returned an item that is neither a viewer id nor a viewer`));
        throw new ChannelError("authorize() returned a wrong type");
      }
      if (asked.has(id)) allowed.add(id);
    }
    return json(200, { allowed: [...allowed] });
  }

  async function credentialsOp(body) {
    if (!authenticate) {
      return json(404, { error: "no_authenticate", message: `routes("${appId}") was given no authenticate function` });
    }
    if (!Array.isArray(body.credentials) || !body.credentials.every((c) => c && typeof c === "object" && typeof c.ref === "string")) {
      return json(400, { error: "invalid_request", message: "credentials must be an array of objects with a ref" });
    }
    const answers = await Promise.all(
      body.credentials.map((credential) =>
        call(`authenticate() of credential ${JSON.stringify(credential.ref)}`, () => authenticate({ headers: {}, ...credential })),
      ),
    );
    const results = {};
    body.credentials.forEach((credential, i) => {
      const answer = answers[i];
      if (answer === null || answer === undefined || answer === false) {
        results[credential.ref] = { refused: "unauthorized" };
      } else if (typeof answer.refused === "string") {
        results[credential.ref] = { refused: answer.refused };
      } else if (isViewer(answer.viewer)) {
        const v = answer.viewer;
        const viewer = {
          id: v.id,
          actor: v.actor ?? v.id,
          accessSubject: v.accessSubject ?? v.id,
          scopes: v.scopes ?? null,
        };
        const expires = answer.expiresInS ?? answer.expires_in_s ?? 60;
        if (!Number.isInteger(expires) || expires < 1) {
          onError(new Error(`outlive hook "${appId}": authenticate() returned expiresInS ${expires}, not a positive integer`));
          throw new ChannelError("authenticate() returned a wrong type");
        }
        results[credential.ref] = { viewer, expires_in_s: expires };
      } else {
        onError(new Error(`outlive hook "${appId}": authenticate() returned neither {viewer}, {refused} nor null`));
        throw new ChannelError("authenticate() returned a wrong type");
      }
    });
    return json(200, { results });
  }

  return async function handle(request) {
    if (request.method !== "POST") {
      return new Response(JSON.stringify({ error: "method_not_allowed", message: "hooks are POST" }), {
        status: 405,
        headers: { "content-type": "application/json", allow: "POST" },
      });
    }
    const raw = await readBody(request, maxBodyBytes);
    if (raw === null) return json(413, { error: "too_large", message: `body above ${maxBodyBytes} bytes` });
    const refusal = verifySignature(request.headers.get(SIGNATURE_HEADER), raw, secrets, { now: now() });
    if (refusal !== null) return json(401, { error: "bad_signature", message: refusal });
    let body;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch {
      return json(400, { error: "invalid_request", message: "the body is not JSON" });
    }
    if (body === null || typeof body !== "object" || Array.isArray(body)) {
      return json(400, { error: "invalid_request", message: "the body is not a JSON object" });
    }
    if (body.app !== appId) {
      return json(404, { error: "unknown_app", message: `these routes serve app "${appId}", not ${JSON.stringify(body.app)}` });
    }
    try {
      if (body.op === "keys") return await keysOp(body);
      if (body.op === "authorize") return await authorizeOp(body);
      if (body.op === undefined && Object.hasOwn(body, "credentials")) return await credentialsOp(body);
      return json(400, { error: "invalid_request", message: `unknown op ${JSON.stringify(body.op)}` });
    } catch (e) {
      if (e instanceof ChannelError) return json(500, { error: "internal", message: e.message });
      onError(e);
      return json(500, { error: "internal", message: "the hook failed" });
    }
  };
}
