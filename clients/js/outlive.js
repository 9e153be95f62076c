// outlive browser client: live updates from /api/<app>/live (SPEC 5.1 rev 4 token, 5.2, 5.3, 5.6, 5.7),
// over a websocket or, where websockets are blocked, Server-Sent Events (5.9).
//
// One ES module without dependencies (the inventory demo serves this file alone). It runs in
// browsers, and in Node 20 given a WebSocket implementation (`new LiveClient({ url, WebSocket })`,
// e.g. the `ws` package's class), because Node 20 has no global WebSocket by default. Types:
// outlive.d.ts; usage: README.md in this folder.

/** Close codes of SPEC 5.7 that the client treats specially. */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  /** not served (credential, origin, app, scope): do not retry */
  NOT_SERVED: 1008,
  TOO_BIG: 1009,
  /** an access check failed or timed out: retry, resume from cursor */
  ACCESS_CHECK_FAILED: 1011,
  /** the replica is stopping: reconnect, resume from cursor */
  REPLICA_STOPPING: 1012,
  /** try again later (slow reader, rate limit, too many sockets): back off, resume */
  TRY_AGAIN_LATER: 1013,
  /** (SPEC rev 4) the socket's JWT expired without a refresh: new token, reconnect at once, resume */
  TOKEN_EXPIRED: 4401,
});

/** Connection states reported to `onState` listeners. */
export const State = Object.freeze({
  CONNECTING: "connecting",
  LIVE: "live",
  RECONNECTING: "reconnecting",
  STOPPED: "stopped",
});

/** Defaults of every timing option, in milliseconds. */
export const DEFAULTS = Object.freeze({
  /** first reconnect delay ceiling; doubles with each failed attempt */
  base: 500,
  /** the reconnect delay ceiling never grows beyond this */
  cap: 30_000,
  /** the lowest delay after a close with 1013 (try again later) */
  overloadMinimum: 5_000,
  /** a connection that stayed open this long resets the backoff */
  stableAfter: 10_000,
  /** a socket that has not opened after this long is abandoned and retried */
  connectTimeout: 15_000,
});

/** Error codes (with an id) after which the subscription ends: retrying the same sub cannot help. */
export const ENDING_ERROR_CODES = Object.freeze([
  "not_found",
  "invalid_scope",
  "unknown_channel",
  "too_many_subscriptions",
  "invalid_message",
  "duplicate_id",
]);
const ENDING = new Set(ENDING_ERROR_CODES);

/** SPEC 5.7: a frame from the tab larger than this closes the socket with 1009. */
export const MAX_FRAME_BYTES = 16 * 1024;
const MAX_ID_LENGTH = 64;

/**
 * The delay before reconnect attempt `attempt` (0 for the first retry), in whole milliseconds.
 *
 * Full jitter: uniform over [minimum, ceiling) where ceiling = min(cap, base * 2^attempt), so that
 * a thousand tabs dropped at once do not come back in step. With a `minimum` (the floor after
 * close 1013) the ceiling is at least twice the minimum, so the floor keeps its spread too.
 * The minimum is itself capped at `cap`.
 *
 * @param {number} attempt failed attempts so far (negative or not a number counts as 0)
 * @param {{base?: number, cap?: number, minimum?: number, random?: () => number}} [options]
 * @returns {number}
 */
export function reconnectDelay(attempt, options = {}) {
  const base = positive(options.base, DEFAULTS.base);
  const cap = positive(options.cap, DEFAULTS.cap);
  const random = typeof options.random === "function" ? options.random : Math.random;
  const minimum = Math.min(cap, Math.max(0, Number(options.minimum) || 0));
  const n = Number.isFinite(attempt) && attempt > 0 ? Math.floor(attempt) : 0;
  const grown = base * 2 ** Math.min(n, 1024); // Infinity beyond, which the cap absorbs
  const ceiling = Math.min(cap, Math.max(grown, 2 * minimum));
  let r = Number(random());
  if (!(r > 0)) r = 0; // NaN and negatives count as 0
  if (r >= 1) r = 1 - Number.EPSILON;
  return Math.floor(minimum + r * (ceiling - minimum));
}

/** The first attempt whose ceiling reaches twice `minimum` (where 1013 starts the backoff). */
export function overloadAttempt(options = {}) {
  const base = positive(options.base, DEFAULTS.base);
  const minimum = Math.max(0, Number(options.minimum) || 0);
  if (minimum === 0) return 0;
  return Math.max(0, Math.ceil(Math.log2((2 * minimum) / base)));
}

function positive(value, fallback) {
  const n = Number(value);
  return Number.isFinite(n) && n > 0 ? n : fallback;
}

/** SPEC 5.2 rev 3: a subscription's filter compares at most this many top-level fields. */
export const MAX_FILTER_FIELDS = 8;

/**
 * Checks a filter as `subscribe` does (SPEC 5.2 rev 3), so that a mistake throws at the call instead
 * of ending the subscription with the server's `invalid_message`. Returns a copy, or null for none
 * (undefined, null, {}). Throws a TypeError or RangeError that names the offending field.
 */
export function checkFilter(filter) {
  if (filter == null) return null;
  const proto = isPlainObject(filter) ? Object.getPrototypeOf(filter) : undefined;
  if (proto !== Object.prototype && proto !== null) throw new TypeError("subscribe: filter must be a plain object of field: value");
  const names = Object.keys(filter);
  if (names.length > MAX_FILTER_FIELDS) throw new RangeError(`subscribe: filter has ${names.length} fields; at most ${MAX_FILTER_FIELDS} are allowed`);
  for (const name of names) {
    const v = filter[name];
    const t = typeof v;
    // NaN and Infinity would go out as null, so they are refused like any non-scalar
    if (v === null || t === "string" || t === "boolean" || (t === "number" && Number.isFinite(v))) continue;
    const what = Array.isArray(v) ? "an array" : t === "number" || t === "undefined" ? String(v) : `${/^[aeiou]/.test(t) ? "an" : "a"} ${t}`;
    throw new TypeError(`subscribe: filter field "${name}" is ${what}; values must be a string, a finite number, a boolean or null`);
  }
  return names.length === 0 ? null : { ...filter };
}

const encoder = typeof TextEncoder === "function" ? new TextEncoder() : null;
function byteLength(text) {
  return encoder ? encoder.encode(text).length : text.length * 3;
}

function frameText(data) {
  if (typeof data === "string") return data;
  if (typeof TextDecoder === "function") {
    if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return new TextDecoder().decode(data);
  }
  return null; // e.g. a Blob: the server sends text frames only
}

/** The transports `LiveClient` can use (`transport` option: these or "auto"). */
export const Transport = Object.freeze({ AUTO: "auto", WEBSOCKET: "websocket", SSE: "sse" });

/** SPEC 5.9: websocket opens that fail in a row before "auto" switches to SSE. */
export const FAILED_OPENS_BEFORE_SSE = 2;

// The replica sends `: ping` every 15 s; a stream silent for three of them is a dead connection
// that TCP may take minutes to notice.
const SSE_IDLE_MS = 45_000;

// A browser that says it is offline fails every open, which says nothing of the network's
// middleboxes: such opens do not count towards the fallback, or a tab offline for a minute would
// stay on SSE for the rest of its session.
function browserOffline() {
  return globalThis.navigator?.onLine === false;
}

// The choice "auto" made, for the tab's session: sessionStorage survives reloads of the tab; where
// it is missing or refused (Node, privacy modes) the module remembers it for the page's lifetime.
const rememberedInMemory = new Map();
function storage() {
  try {
    const s = globalThis.sessionStorage;
    if (s && typeof s.getItem === "function") return s;
  } catch {
    // access itself throws when storage is disabled
  }
  return null;
}
function recall(key) {
  try {
    const v = storage()?.getItem(key);
    if (v != null) return v;
  } catch {
    // fall through to memory
  }
  return rememberedInMemory.get(key) ?? null;
}
function remember(key, value) {
  rememberedInMemory.set(key, value);
  try {
    storage()?.setItem(key, value);
  } catch {
    // quota or privacy mode: memory is enough for this page
  }
}

function base64url(text) {
  const bytes = encoder ? encoder.encode(text) : Uint8Array.from(unescape(encodeURIComponent(text)), (c) => c.charCodeAt(0));
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// SPEC 5.9: a refusal known before the stream starts is an HTTP status; the close code it stands
// for picks the same policy a websocket close would (401/403/404/400 stop, 429/503 retry).
function statusCloseCode(status) {
  if (status === 400 || status === 401 || status === 403 || status === 404) return CloseCode.NOT_SERVED;
  if (status === 429) return CloseCode.TRY_AGAIN_LATER;
  if (status === 503) return CloseCode.REPLICA_STOPPING;
  return 1006; // a gateway's 502/504 and the like: the replica was not reached
}

/**
 * One SSE stream (SPEC 5.9) read with a streaming fetch, shaped like a WebSocket for the client:
 * onopen at the 200, onmessage per `data` event, onclose once with the code of `event: close`
 * (1006 when the stream just ends or fails). fetch rather than EventSource because EventSource
 * reconnects by itself with the stale subs of its URL and hides both HTTP statuses and the POST
 * a token needs.
 */
class SseStream {
  onopen = null;
  onmessage = null;
  onclose = null;
  #abort = typeof AbortController === "function" ? new AbortController() : null;
  #done = false;
  #idle = null;
  #timers;

  constructor(fetchImpl, url, subs, token, timers) {
    this.#timers = timers;
    const init = {
      credentials: "include",
      cache: "no-store",
      headers: { accept: "text/event-stream" },
      signal: this.#abort?.signal,
    };
    if (token != null) {
      init.method = "POST";
      init.headers["content-type"] = "application/json";
      init.body = JSON.stringify({ subs, token });
    } else {
      init.method = "GET";
      url += (url.includes("?") ? "&" : "?") + "subs=" + base64url(JSON.stringify(subs));
    }
    this.#run(fetchImpl, url, init).catch(() => this.#finish(1006, "the stream failed"));
  }

  close() {
    this.#done = true;
    this.#stopIdle();
    try {
      this.#abort?.abort();
    } catch {
      // nothing to abort
    }
  }

  async #run(fetchImpl, url, init) {
    let response;
    try {
      response = await fetchImpl(url, init);
    } catch {
      this.#finish(1006, "the stream could not be opened");
      return;
    }
    if (this.#done) return;
    if (response.status !== 200 || !response.body) {
      let text = "";
      try {
        text = await response.text();
      } catch {
        // no body: the status says enough
      }
      if (this.#done) return;
      if (text) this.onmessage?.({ data: text }); // the refusal's error frame (SPEC 5.9)
      this.#finish(statusCloseCode(response.status), `HTTP ${response.status}`);
      return;
    }
    this.#armIdle();
    this.onopen?.({ type: "open" });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let data = [];
    let name = "";
    for (;;) {
      if (this.#done) {
        reader.cancel().catch(() => {});
        return;
      }
      let chunk;
      try {
        chunk = await reader.read();
      } catch {
        this.#finish(1006, "the stream was cut");
        return;
      }
      if (this.#done) return;
      if (chunk.done) {
        this.#finish(1006, "the stream ended without a close event");
        return;
      }
      this.#armIdle();
      buffer += decoder.decode(chunk.value, { stream: true });
      let nl;
      while ((nl = buffer.search(/\r\n|\r|\n/)) >= 0) {
        if (buffer[nl] === "\r" && nl === buffer.length - 1) break; // maybe half of a \r\n
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) {
            const text = data.join("\n");
            if (name === "close") {
              let info = null;
              try {
                info = JSON.parse(text);
              } catch {
                // a close event we cannot read still ends the stream
              }
              const code = typeof info?.code === "number" ? info.code : 1006;
              this.#finish(code, typeof info?.reason === "string" ? info.reason : "");
              return;
            }
            if (name === "" || name === "message") this.onmessage?.({ data: text });
            if (this.#done) return;
          }
          data = [];
          name = "";
          continue;
        }
        if (line.startsWith(":")) continue; // `: ping`
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") data.push(value);
        else if (field === "event") name = value;
      }
    }
  }

  #armIdle() {
    this.#stopIdle();
    this.#idle = this.#timers.setTimeout(() => {
      this.#idle = null;
      this.#finish(1006, "the stream went silent");
    }, SSE_IDLE_MS);
  }

  #stopIdle() {
    if (this.#idle != null) this.#timers.clearTimeout(this.#idle);
    this.#idle = null;
  }

  #finish(code, reason) {
    if (this.#done) return;
    this.close();
    this.onclose?.({ type: "close", code, reason });
  }
}

function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * A subscription returned by `LiveClient.subscribe`.
 * `cursor` is the position the subscription is live from (what a reconnect resumes from).
 */
export class Subscription {
  #record;
  #end;

  /** @internal */
  constructor(record, end) {
    this.#record = record;
    this.#end = end;
  }

  /** the id the client chose for this subscription (unique on the client, 1-64 characters) */
  get id() { return this.#record.id; }
  get channel() { return this.#record.channel; }
  get scope() { return this.#record.scope; }
  /** the equality filter sent with the sub, or null */
  get filter() { return this.#record.filter; }
  /** the last cursor seen (subscribed, update, resync, progress), or the initial one */
  get cursor() { return this.#record.cursor; }
  /** false once unsubscribed, revoked, ended by an error, or the client is closed */
  get active() { return this.#record.active; }

  /** Ends the subscription (sends `unsub` when the server knows it). Idempotent. */
  unsubscribe() { this.#end(this.#record); }
}

/**
 * A connection to one app's live endpoint, carrying any number of subscriptions (the server
 * allows 16 per socket). It connects at construction and reconnects by itself.
 */
export class LiveClient {
  #url;
  #WebSocket;
  #fetch;
  #transportOption; // "auto" | "websocket" | "sse"
  #transport; // what the next connection uses: "websocket" | "sse"
  #failedOpens = 0; // websocket opens that failed in a row ("auto" only)
  #pending = null; // SSE: the stream opening with a new set of subs, while #conn still delivers
  #random;
  #setTimeout;
  #clearTimeout;
  #reportError;
  #token = null; // options.token: () => string | Promise<string>, or null
  #expiredInRow = 0; // closes with 4401 since the last connection that stayed open stableAfter
  #timing;
  #idPrefix;
  #overloadAttempt;

  #state = State.CONNECTING;
  #stateInfo = {};
  #stateListeners = new Set();
  #errorListeners = new Set();

  #subs = new Map(); // id -> record, active subscriptions only
  #nextId = 1;
  // {ws, open, ready (subs may be sent: open, and the auth frame sent when there is a token),
  //  refreshing, sent: Set<id>, confirmed: Set<id>, resumed: Map<id, bool>, lastError, invalidScope}
  #conn = null;
  #attempt = 0;
  #timers = { retry: null, stable: null, connect: null };
  #closed = false;

  /** Connects at once. Options and their defaults: LiveClientOptions in outlive.d.ts, and README.md. */
  constructor(options = {}) {
    if (!isPlainObject(options)) throw new TypeError("LiveClient: options must be an object");
    if (options.url != null) this.#url = options.url;
    else if (typeof options.app === "string" && options.app) this.#url = `/api/${encodeURIComponent(options.app)}/live`;
    else throw new TypeError("LiveClient: give a url (e.g. \"wss://host/api/inventory/live\") or an app id");

    const transport = options.transport ?? Transport.AUTO;
    if (!Object.values(Transport).includes(transport)) throw new TypeError('LiveClient: transport must be "auto", "websocket" or "sse"');
    this.#transportOption = transport;
    this.#WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.#fetch = options.fetch ?? (typeof globalThis.fetch === "function" ? globalThis.fetch.bind(globalThis) : null);
    if (transport !== Transport.WEBSOCKET && typeof this.#fetch !== "function") {
      if (transport === Transport.SSE) throw new TypeError("LiveClient: transport \"sse\" needs fetch (pass one as the fetch option)");
      this.#fetch = null; // "auto" without fetch: websocket only
    }
    if (transport === Transport.SSE) this.#transport = Transport.SSE;
    else if (transport === Transport.AUTO && this.#fetch && recall(this.#rememberKey()) === Transport.SSE) this.#transport = Transport.SSE;
    else this.#transport = Transport.WEBSOCKET;
    if (transport !== Transport.SSE && typeof this.#WebSocket !== "function") {
      throw new TypeError(
        "LiveClient: no WebSocket implementation; pass one as the WebSocket option " +
          "(in Node 20: import { WebSocket } from \"ws\")",
      );
    }
    this.#random = typeof options.random === "function" ? options.random : Math.random;
    this.#setTimeout = options.setTimeout ?? globalThis.setTimeout.bind(globalThis);
    this.#clearTimeout = options.clearTimeout ?? globalThis.clearTimeout.bind(globalThis);
    this.#reportError =
      typeof options.reportError === "function"
        ? options.reportError
        : typeof globalThis.reportError === "function"
          ? (e) => globalThis.reportError(e)
          : (e) => console.error("outlive: a callback threw", e);
    this.#timing = {
      base: positive(options.base, DEFAULTS.base),
      cap: positive(options.cap, DEFAULTS.cap),
      overloadMinimum: options.overloadMinimum === 0 ? 0 : positive(options.overloadMinimum, DEFAULTS.overloadMinimum),
      stableAfter: positive(options.stableAfter, DEFAULTS.stableAfter),
      connectTimeout: options.connectTimeout === 0 ? 0 : positive(options.connectTimeout, DEFAULTS.connectTimeout),
    };
    this.#overloadAttempt = overloadAttempt({ base: this.#timing.base, minimum: this.#timing.overloadMinimum });
    const prefix = options.idPrefix ?? "s";
    if (typeof prefix !== "string" || prefix.length > 32) throw new TypeError("LiveClient: idPrefix must be a string of at most 32 characters");
    this.#idPrefix = prefix;
    if (options.token != null) {
      if (typeof options.token !== "function") throw new TypeError("LiveClient: token must be a function returning the token (or a promise of it)");
      this.#token = options.token;
    }

    this.#connect(true);
  }

  /** "connecting" | "live" | "reconnecting" | "stopped" */
  get state() { return this.#state; }

  /** the transport of the current (or next) connection: "websocket" or "sse" */
  get transport() { return this.#transport; }

  /**
   * Details of the current state: for "reconnecting" `{code, reason, attempt, delay, error?}`,
   * for "stopped" `{code, reason, error?}` (error: the last socket-level error frame).
   */
  get stateInfo() { return this.#stateInfo; }

  /** the active subscriptions */
  get subscriptions() { return [...this.#subs.values()].map((r) => r.facade); }

  /**
   * Calls `listener(state, info)` now with the current state and on every change.
   * @returns {() => void} removes the listener
   */
  onState(listener) {
    if (typeof listener !== "function") throw new TypeError("onState: listener must be a function");
    this.#stateListeners.add(listener);
    this.#call(listener, this.#state, this.#stateInfo);
    return () => this.#stateListeners.delete(listener);
  }

  /**
   * Calls `listener({code, message})` for error frames that concern the socket rather than one
   * subscription (e.g. `unauthorized` before close 1008, `rate_limited` before close 1013).
   * @returns {() => void} removes the listener
   */
  onError(listener) {
    if (typeof listener !== "function") throw new TypeError("onError: listener must be a function");
    this.#errorListeners.add(listener);
    return () => this.#errorListeners.delete(listener);
  }

  /**
   * Subscribes to a channel. The sub is sent now when the socket is open, else when it opens, and
   * again with its last cursor after every reconnect.
   *
   * Options (channel, scope, filter, cursor, callbacks): SubscribeOptions in outlive.d.ts.
   * @returns {Subscription}
   */
  subscribe(options) {
    if (this.#closed) throw new Error("LiveClient: subscribe after close()");
    if (!isPlainObject(options)) throw new TypeError("subscribe: options must be an object");
    const { channel, scope = {}, cursor } = options;
    const filter = checkFilter(options.filter);
    if (typeof channel !== "string" || channel.length === 0) throw new TypeError("subscribe: channel must be a non-empty string");
    if (!isPlainObject(scope)) throw new TypeError("subscribe: scope must be an object");
    if (cursor != null && (typeof cursor !== "string" || cursor.length === 0)) throw new TypeError("subscribe: cursor must be a non-empty string");
    for (const name of ["onUpdate", "onResync", "onRevoked", "onError", "onSubscribed", "validate"]) {
      if (options[name] != null && typeof options[name] !== "function") throw new TypeError(`subscribe: ${name} must be a function`);
    }
    const id = `${this.#idPrefix}${(this.#nextId++).toString(36)}`;
    if (id.length > MAX_ID_LENGTH) throw new RangeError("subscribe: subscription id too long");
    const record = {
      id,
      channel,
      scope: JSON.parse(JSON.stringify(scope)), // the client keeps its own copy to resend
      filter,
      cursor: cursor ?? null,
      handlers: {
        onUpdate: options.onUpdate,
        onResync: options.onResync,
        onRevoked: options.onRevoked,
        onError: options.onError,
        onSubscribed: options.onSubscribed,
        validate: options.validate,
      },
      active: true,
      facade: null,
    };
    // Refuse here what the server would answer with close 1009 (and again after every reconnect).
    const size = byteLength(JSON.stringify(this.#subFrame(record))) + 64; // room for a longer cursor
    if (size > MAX_FRAME_BYTES) throw new RangeError(`subscribe: the sub frame would exceed ${MAX_FRAME_BYTES} bytes`);
    record.facade = new Subscription(record, (r) => this.#unsubscribe(r));
    this.#subs.set(id, record);
    const conn = this.#conn;
    if (conn && conn.ready) this.#sendSub(conn, record);
    return record.facade;
  }

  /**
   * Reconnects now with a fresh backoff, e.g. after "stopped" on 1008 once the user signed in
   * again, or on the browser's `online` event. Active subscriptions resume from their cursors.
   */
  reconnect() {
    if (this.#closed) throw new Error("LiveClient: reconnect after close()");
    this.#clearTimer("retry");
    this.#dropPending();
    this.#drop(this.#conn);
    this.#attempt = 0;
    this.#expiredInRow = 0;
    this.#connect(false);
  }

  /** Closes the socket for good: no more callbacks, no reconnect, every subscription ends. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#clearTimer("retry");
    this.#clearTimer("resubscribe");
    this.#dropPending();
    this.#drop(this.#conn);
    for (const record of this.#subs.values()) record.active = false;
    this.#subs.clear();
    this.#setState(State.STOPPED, { code: CloseCode.NORMAL, reason: "closed by the client" });
    this.#stateListeners.clear();
    this.#errorListeners.clear();
  }

  // --- connection --------------------------------------------------------------------------

  #resolveUrl() {
    let url = typeof this.#url === "function" ? this.#url() : this.#url;
    url = String(url);
    if (!/^wss?:\/\//i.test(url)) {
      const base = globalThis.location?.href;
      if (!base && !/^https?:\/\//i.test(url)) throw new TypeError(`LiveClient: cannot resolve the relative url ${url} without a page location`);
      const u = new URL(url, base);
      if (u.protocol === "http:") u.protocol = "ws:";
      else if (u.protocol === "https:") u.protocol = "wss:";
      url = u.href;
    }
    return url;
  }

  #rememberKey() {
    return `outlive.transport ${typeof this.#url === "function" ? "" : String(this.#url)}`;
  }

  /** The SSE endpoint next to the websocket one: /api/<app>/live/sse over http(s). */
  #sseUrl() {
    const u = new URL(this.#resolveUrl());
    u.protocol = u.protocol === "wss:" ? "https:" : "http:";
    u.pathname = u.pathname.replace(/\/+$/, "") + "/sse";
    return u.href;
  }

  #newConn(sse) {
    return { sse, ws: null, open: false, ready: false, refreshing: false, frames: 0, sent: new Set(), confirmed: new Set(), resumed: new Map(), lastError: null, invalidScope: null };
  }

  /** a connection whose events still matter: the client's, or the SSE stream about to replace it */
  #isCurrent(conn) {
    return !this.#closed && (this.#conn === conn || this.#pending === conn);
  }

  #connect(first, keepState = false) {
    if (this.#transport === Transport.SSE) {
      this.#connectSse(first, false, keepState);
      return;
    }
    let ws;
    try {
      ws = new this.#WebSocket(this.#resolveUrl());
    } catch (error) {
      if (first) throw error; // a bad URL or implementation: tell the caller at once
      this.#setState(State.STOPPED, { code: null, reason: "cannot open a socket", error });
      this.#emitError({ code: "socket", message: String(error?.message ?? error) });
      return;
    }
    const conn = this.#newConn(false);
    conn.ws = ws;
    this.#conn = conn;
    ws.onopen = () => this.#onOpen(conn);
    ws.onmessage = (event) => this.#onMessage(conn, event);
    ws.onclose = (event) => this.#onClose(conn, event?.code, event?.reason);
    ws.onerror = () => {}; // a close event follows; it carries what we need
    if (this.#timing.connectTimeout > 0) {
      this.#startTimer("connect", this.#timing.connectTimeout, () => {
        if (this.#conn !== conn || conn.ready) return; // open, and the auth frame sent
        this.#drop(conn);
        this.#onClose(conn, 1006, "connect timeout", true);
      });
    }
    this.#setState(first ? State.CONNECTING : State.RECONNECTING, first ? {} : { ...this.#stateInfo });
  }

  /**
   * SPEC 5.9: a stream carries its subs in the request, each from the cursor it has now. `pending`:
   * a new set of subs while the current stream keeps delivering until this one answers (then the
   * old one is closed, and what it delivered meanwhile is not delivered again: `record.seen`).
   */
  #connectSse(first, pending, keepState = false) {
    if (first) this.#sseUrl(); // a URL that cannot be resolved throws at construction, as for a socket
    const conn = this.#newConn(true);
    if (pending) {
      this.#pending = conn;
    } else {
      this.#conn = conn;
      if (this.#timing.connectTimeout > 0) {
        this.#startTimer("connect", this.#timing.connectTimeout, () => {
          if (this.#conn !== conn || conn.ready) return;
          this.#drop(conn);
          this.#onClose(conn, 1006, "connect timeout", true);
        });
      }
      if (!keepState) this.#setState(first ? State.CONNECTING : State.RECONNECTING, first ? {} : { ...this.#stateInfo });
    }
    const start = (token) => {
      if (!this.#isCurrent(conn)) return;
      // The subs go now, each from the cursor it has now; in a pending stream's replay, what the
      // old stream delivers from here on comes again (record.seen).
      const records = [...this.#subs.values()];
      for (const record of records) {
        conn.sent.add(record.id);
        conn.resumed.set(record.id, record.cursor != null);
        if (pending) record.seen = { conn, cursors: new Set() };
      }
      const frames = records.map((record) => this.#subFrame(record));
      let stream;
      try {
        stream = new SseStream(this.#fetch, this.#sseUrl(), frames, token, { setTimeout: this.#setTimeout, clearTimeout: this.#clearTimeout });
      } catch (error) {
        this.#streamClosed(conn, 1006, String(error?.message ?? error));
        return;
      }
      conn.ws = stream;
      stream.onopen = () => this.#onStreamOpen(conn);
      stream.onmessage = (event) => this.#onMessage(conn, event);
      stream.onclose = (event) => this.#streamClosed(conn, event?.code, event?.reason);
    };
    // After the current task, so that the subscribe() calls right after `new LiveClient` (or a
    // reconnect) go in this stream rather than in the next one.
    queueMicrotask(() => {
      if (!this.#isCurrent(conn)) return;
      if (!this.#token) {
        start(null);
        return;
      }
      // The token goes in the POST body, fetched anew for every stream (as for every socket).
      this.#fetchToken(conn, start, (error) => {
        if (!this.#isCurrent(conn)) return;
        this.#emitError({ code: "token", message: `token() failed: ${String(error?.message ?? error)}` });
        conn.tokenError = error;
        this.#streamClosed(conn, 1006, "token() failed");
      });
    });
  }

  #onStreamOpen(conn) {
    if (this.#closed) return;
    if (this.#pending === conn) {
      // The new stream serves every sub from its cursor: the old one may go.
      const old = this.#conn;
      this.#pending = null;
      this.#drop(old);
      this.#conn = conn;
    }
    if (this.#conn !== conn) return;
    conn.open = true;
    this.#ready(conn);
  }

  #streamClosed(conn, code, reason) {
    if (this.#pending === conn) {
      // The new set could not be opened: the old stream goes too, and the usual policy for this
      // code reconnects (or stops) with every sub from its cursor.
      this.#dropPending();
      const current = this.#conn;
      if (!current || this.#closed) return;
      this.#drop(current);
      if (conn.tokenError) current.tokenError = conn.tokenError;
      if (conn.lastError) current.lastError = conn.lastError;
      this.#onClose(current, code, reason, true);
      return;
    }
    this.#onClose(conn, code, reason);
  }

  #dropPending() {
    const conn = this.#pending;
    if (!conn) return;
    this.#pending = null;
    if (conn.ws) {
      conn.ws.onopen = conn.ws.onmessage = conn.ws.onclose = null;
      conn.ws.close();
    }
  }

  /** SSE: the subs changed (or a token is due), so a new stream replaces the current one. */
  #scheduleResubscribe(force = false) {
    if (force) this.#forceResubscribe = true;
    if (this.#timers.resubscribe != null) return;
    // after the current task, so that several subscribe()/unsubscribe() calls make one stream
    this.#startTimer("resubscribe", 0, () => this.#resubscribe());
  }

  #forceResubscribe = false;

  #resubscribe() {
    const force = this.#forceResubscribe;
    this.#forceResubscribe = false;
    const conn = this.#conn;
    if (this.#closed || !conn || !conn.sse) return;
    const target = this.#pending ?? conn;
    const ids = [...this.#subs.keys()];
    if (!force && ids.length === target.sent.size && ids.every((id) => target.sent.has(id))) return;
    this.#dropPending();
    if (!conn.open) {
      // nothing delivered yet: start that connection over with the new set
      this.#drop(conn);
      this.#connectSse(false, false, true);
      return;
    }
    this.#connectSse(false, true);
  }

  /** Detaches a connection's handlers and closes its socket (no close event reaches us). */
  #drop(conn) {
    if (!conn) return;
    if (this.#conn === conn) this.#conn = null;
    this.#clearTimer("stable");
    this.#clearTimer("connect");
    const ws = conn.ws;
    if (!ws) return; // an SSE stream still waiting for its token
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => {};
    try {
      ws.close(CloseCode.NORMAL);
    } catch {
      // already closed, or the implementation refuses: nothing to do
    }
  }

  #onOpen(conn) {
    if (this.#conn !== conn || this.#closed) return;
    conn.open = true;
    if (this.#token) {
      // SPEC 5.1 rev 4: the token goes as the socket's first message (never in the URL), fetched
      // anew for every socket so that a rejoin never sends a stale one. The connect timeout keeps
      // running until it is sent: a token() that never settles is a socket that never opened.
      this.#fetchToken(
        conn,
        (token) => {
          if (!this.#send(conn, { type: "auth", token })) return;
          this.#ready(conn);
        },
        (error) => this.#tokenFailedAtOpen(conn, error),
      );
      return;
    }
    this.#ready(conn);
  }

  /** The socket may carry subs: send them all, report "live". */
  #ready(conn) {
    if (this.#conn !== conn || this.#closed) return;
    conn.ready = true;
    this.#clearTimer("connect");
    this.#startTimer("stable", this.#timing.stableAfter, () => {
      if (this.#conn !== conn) return;
      this.#attempt = 0;
      this.#expiredInRow = 0;
    });
    for (const record of this.#subs.values()) {
      if (this.#conn !== conn) return; // a callback replaced the socket
      this.#sendSub(conn, record);
    }
    this.#setState(State.LIVE, {});
  }

  /**
   * Calls token() and hands a usable token to `done`, or the failure to `failed`; neither runs
   * once `conn` is no longer the client's socket (dropped, replaced, closed).
   */
  #fetchToken(conn, done, failed) {
    const current = () => this.#isCurrent(conn);
    const check = (token) => {
      if (!current()) return;
      if (typeof token !== "string" || token.length === 0) {
        failed(new TypeError(`LiveClient: token() gave ${token === "" ? "an empty string" : typeof token}, not a token`));
        return;
      }
      if (byteLength(JSON.stringify({ type: "auth", token })) > MAX_FRAME_BYTES) {
        failed(new RangeError(`LiveClient: the auth frame would exceed ${MAX_FRAME_BYTES} bytes`));
        return;
      }
      done(token);
    };
    let result;
    try {
      result = this.#token();
    } catch (error) {
      failed(error);
      return;
    }
    if (result != null && typeof result.then === "function") {
      Promise.resolve(result).then(check, (error) => {
        if (current()) failed(error);
      });
    } else {
      check(result);
    }
  }

  /** token() failed for a socket that just opened: a failed open (backoff), reported. */
  #tokenFailedAtOpen(conn, error) {
    if (this.#conn !== conn || this.#closed) return;
    this.#emitError({ code: "token", message: `token() failed: ${String(error?.message ?? error)}` });
    if (this.#conn !== conn || this.#closed) return; // a listener reconnected or closed
    this.#drop(conn);
    conn.tokenError = error;
    this.#onClose(conn, 1006, "token() failed", true);
  }

  /** SPEC 5.1 rev 4: auth_expiring on an open socket: a new token as an auth frame, subs kept. */
  #refreshToken(conn) {
    if (!this.#token) return;
    if (conn.sse) {
      // A stream cannot take an auth frame: a new stream with a new token replaces it, losslessly.
      this.#scheduleResubscribe(true);
      return;
    }
    if (conn.refreshing) return;
    conn.refreshing = true;
    this.#fetchToken(
      conn,
      (token) => {
        conn.refreshing = false;
        // an auth frame sent before the first one (still fetching) would not be the first message
        if (conn.ready) this.#send(conn, { type: "auth", token });
      },
      (error) => {
        conn.refreshing = false;
        // The socket stays; without a new token the server closes it with 4401, and the
        // reconnect asks token() again.
        this.#emitError({ code: "token", message: `token() failed: ${String(error?.message ?? error)}` });
      },
    );
  }

  #onClose(conn, code, reason, alreadyDropped = false) {
    if (this.#conn !== conn && !alreadyDropped) return;
    if (!alreadyDropped) this.#drop(conn);
    if (this.#closed) return;
    code = typeof code === "number" ? code : 1006;
    reason = typeof reason === "string" ? reason : "";
    if (this.#pending && code === CloseCode.NOT_SERVED) this.#dropPending();
    if (this.#pending) {
      // The stream ended (e.g. rotated, 1012) while its replacement was opening: that one
      // carries every sub already, so it becomes the connection.
      this.#conn = this.#pending;
      this.#pending = null;
      if (this.#timing.connectTimeout > 0) {
        const next = this.#conn;
        this.#startTimer("connect", this.#timing.connectTimeout, () => {
          if (this.#conn !== next || next.ready) return;
          this.#drop(next);
          this.#onClose(next, 1006, "connect timeout", true);
        });
      }
      this.#setState(State.RECONNECTING, { code, reason, attempt: this.#attempt, delay: 0 });
      return;
    }
    if (!conn.sse && this.#transportOption === Transport.AUTO && this.#fetch) {
      // SPEC 5.9: a socket that never opened, or that a middlebox cut (1006) before any frame.
      if (!(!conn.open || (code === 1006 && conn.frames === 0))) this.#failedOpens = 0;
      else if (!browserOffline()) this.#failedOpens++;
      if (this.#failedOpens >= FAILED_OPENS_BEFORE_SSE) {
        this.#failedOpens = 0;
        this.#transport = Transport.SSE;
        remember(this.#rememberKey(), Transport.SSE);
        // Another path, not the same one again: no reason to wait.
        this.#setState(State.RECONNECTING, { code, reason, attempt: this.#attempt, delay: 0, transport: Transport.SSE });
        if (!this.#closed && this.#conn === null) this.#connect(false);
        return;
      }
    }
    const error = conn.tokenError ?? conn.lastError ?? undefined;
    const invalidScope = code === CloseCode.NOT_SERVED ? conn.invalidScope : null;
    if (code === CloseCode.NOT_SERVED && invalidScope == null) {
      // The credential, origin or app is refused: retrying cannot help.
      this.#setState(State.STOPPED, { code, reason, ...(error ? { error } : {}) });
      return;
    }
    // A 1008 that followed an invalid_scope error for one of our subs is about that sub only: it
    // has ended (its onError ran), so the same socket would not be refused again. The others
    // resume from their cursors after the usual backoff (which also bounds a caller that keeps
    // subscribing with an invalid scope).
    if (code === CloseCode.TOKEN_EXPIRED) {
      // SPEC 5.1 rev 4: the token expired without a refresh: a new one and reconnect at once,
      // resuming from the cursors. Only once in a row: a 4401 again before the next connection
      // stayed open stableAfter (a token() that keeps giving expired tokens) takes the backoff.
      if (this.#expiredInRow++ === 0) {
        this.#setState(State.RECONNECTING, { code, reason, attempt: this.#attempt, delay: 0, ...(error ? { error } : {}) });
        if (!this.#closed && this.#conn === null) this.#connect(false);
        return;
      }
    }
    let minimum = 0;
    if (code === CloseCode.TRY_AGAIN_LATER) {
      this.#attempt = Math.max(this.#attempt, this.#overloadAttempt);
      minimum = this.#timing.overloadMinimum;
    }
    const attempt = this.#attempt;
    const delay = reconnectDelay(attempt, { base: this.#timing.base, cap: this.#timing.cap, minimum, random: this.#random });
    this.#attempt = attempt + 1;
    this.#setState(State.RECONNECTING, {
      code,
      reason,
      attempt,
      delay,
      ...(error ? { error } : {}),
      ...(invalidScope != null ? { invalidScope } : {}),
    });
    this.#startTimer("retry", delay, () => {
      if (!this.#closed && this.#conn === null) this.#connect(false);
    });
  }

  #startTimer(which, ms, fn) {
    this.#clearTimer(which);
    this.#timers[which] = this.#setTimeout(() => {
      this.#timers[which] = null;
      fn();
    }, ms);
  }

  #clearTimer(which) {
    const handle = this.#timers[which];
    this.#timers[which] = null;
    if (handle != null) this.#clearTimeout(handle);
  }

  #setState(state, info) {
    const changed = state !== this.#state;
    this.#state = state;
    this.#stateInfo = Object.freeze({ ...info });
    if (!changed) return;
    for (const listener of [...this.#stateListeners]) this.#call(listener, state, this.#stateInfo);
  }

  // --- frames ------------------------------------------------------------------------------

  #subFrame(record) {
    const frame = { type: "sub", id: record.id, channel: record.channel, scope: record.scope };
    if (record.filter != null) frame.filter = record.filter;
    if (record.cursor != null) frame.cursor = record.cursor;
    return frame;
  }

  #sendSub(conn, record) {
    if (!record.active || conn.sent.has(record.id)) return;
    if (conn.sse) {
      this.#scheduleResubscribe();
      return;
    }
    const frame = this.#subFrame(record);
    conn.sent.add(record.id);
    conn.resumed.set(record.id, frame.cursor != null);
    this.#send(conn, frame);
  }

  #send(conn, frame) {
    try {
      conn.ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false; // the socket is closing; its close event brings the reconnect
    }
  }

  #unsubscribe(record) {
    if (!record.active) return;
    this.#end(record);
    const conn = this.#conn;
    if (conn && conn.sse) this.#scheduleResubscribe();
    else if (conn && conn.open && conn.sent.has(record.id)) this.#send(conn, { type: "unsub", id: record.id });
  }

  #end(record) {
    record.active = false;
    this.#subs.delete(record.id);
    const conn = this.#conn;
    if (conn) conn.confirmed.delete(record.id);
  }

  /** The active subscription `id` names on this connection, or undefined. */
  #record(conn, id) {
    if (typeof id !== "string") return undefined;
    const record = this.#subs.get(id);
    return record && conn.sent.has(id) ? record : undefined;
  }

  #onMessage(conn, event) {
    if (this.#conn !== conn || this.#closed) return;
    const text = frameText(event?.data);
    if (text == null) return;
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      return; // not ours to fix; the server sends JSON
    }
    if (!isPlainObject(msg)) return;
    conn.frames++;
    const cursor = typeof msg.cursor === "string" ? msg.cursor : undefined;
    // SSE, a new stream replaying from the cursors its subs were sent with: `record.seen` holds
    // what the old stream delivered since (cursors name one position on every replica).
    const replaying = (record) => record.seen != null && record.seen.conn === conn && record.seen.cursors.size > 0;

    switch (msg.type) {
      case "subscribed": {
        const record = this.#record(conn, msg.id);
        if (!record) return;
        if (cursor !== undefined && !replaying(record)) record.cursor = cursor;
        conn.confirmed.add(record.id);
        this.#call(record.handlers.onSubscribed, { cursor: record.cursor, resumed: conn.resumed.get(record.id) === true });
        return;
      }
      case "update": {
        const ids = Array.isArray(msg.ids) ? msg.ids : typeof msg.id === "string" ? [msg.id] : [];
        for (const id of ids) {
          if (this.#conn !== conn) return; // a callback closed or replaced the socket
          const record = this.#record(conn, id);
          if (!record) continue;
          if (record.seen != null) {
            if (record.seen.conn === conn) {
              if (cursor !== undefined && record.seen.cursors.delete(cursor)) continue; // delivered by the old stream
              record.seen = null; // past the seam
            } else if (this.#pending != null && record.seen.conn === this.#pending && cursor !== undefined) {
              record.seen.cursors.add(cursor);
            }
          }
          if (cursor !== undefined) record.cursor = cursor;
          conn.confirmed.add(record.id);
          this.#deliver(record, msg.data, msg.key, record.cursor);
        }
        return;
      }
      case "resync": {
        const record = this.#record(conn, msg.id);
        if (!record) return;
        if (record.seen != null && record.seen.conn === conn) record.seen = null; // loads anew from here
        if (cursor !== undefined) record.cursor = cursor;
        conn.confirmed.add(record.id);
        this.#call(record.handlers.onResync, { reason: typeof msg.reason === "string" ? msg.reason : "unknown", cursor: record.cursor });
        return;
      }
      case "revoked": {
        const record = this.#record(conn, msg.id);
        if (!record) return;
        this.#end(record);
        this.#call(record.handlers.onRevoked, { reason: typeof msg.reason === "string" ? msg.reason : "access_denied" });
        return;
      }
      case "progress": {
        if (cursor === undefined) return;
        // Only subscriptions the server has confirmed on this socket: a sub still waiting in the
        // server's queue has not seen the updates before this position.
        for (const id of conn.confirmed) {
          const record = this.#subs.get(id);
          if (record && !replaying(record)) record.cursor = cursor;
        }
        return;
      }
      case "error": {
        const info = {
          code: typeof msg.code === "string" ? msg.code : "unknown",
          message: typeof msg.message === "string" ? msg.message : "",
        };
        if (msg.id != null) {
          // The server closes the socket with 1008 right after this error (SPEC 5.4), for every
          // subscription on it. Remember which sub caused it, so that the close ends only that
          // one (below) and the others resume, even if the user unsubscribed it meanwhile.
          if (info.code === "invalid_scope" && conn.sent.has(msg.id)) conn.invalidScope = msg.id;
          const record = this.#record(conn, msg.id);
          if (!record) return;
          const ended = ENDING.has(info.code);
          if (ended) this.#end(record);
          this.#call(record.handlers.onError, { ...info, ended });
          return;
        }
        conn.lastError = info;
        conn.invalidScope = null; // a socket-level refusal came after: the close is about the socket
        this.#emitError(info);
        return;
      }
      case "auth_expiring":
        this.#refreshToken(conn);
        return;
      default:
        return; // a frame type from a newer server: ignore
    }
  }

  #deliver(record, data, key, cursor) {
    const { validate, onUpdate, onResync } = record.handlers;
    let valid = true;
    let error;
    if (validate) {
      try {
        valid = validate(data) !== false;
      } catch (e) {
        valid = false;
        error = e;
      }
    }
    if (valid) this.#call(onUpdate, data, { key, cursor });
    else this.#call(onResync, error === undefined ? { reason: "invalid", cursor } : { reason: "invalid", cursor, error });
  }

  #emitError(info) {
    for (const listener of [...this.#errorListeners]) this.#call(listener, info);
  }

  #call(fn, ...args) {
    if (typeof fn !== "function") return;
    try {
      fn(...args);
    } catch (error) {
      try {
        this.#reportError(error);
      } catch {
        // a throwing reporter must not break the client either
      }
    }
  }
}
