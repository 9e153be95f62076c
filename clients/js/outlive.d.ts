// Types of @outlive/client (outlive.js). Hand-written: the JavaScript is the implementation, this
// file the contract users compile against; examples/usage.ts checks both agree (tsc --noEmit).

/** Close codes of SPEC 5.7 that the client treats specially. */
export declare const CloseCode: Readonly<{
  NORMAL: 1000;
  /** not served (credential, origin, app, scope): do not retry */
  NOT_SERVED: 1008;
  TOO_BIG: 1009;
  /** an access check failed or timed out: retry, resume from cursor */
  ACCESS_CHECK_FAILED: 1011;
  /** the replica is stopping: reconnect, resume from cursor */
  REPLICA_STOPPING: 1012;
  /** try again later (slow reader, rate limit, too many sockets): back off, resume */
  TRY_AGAIN_LATER: 1013;
  /** (SPEC rev 4) the socket's JWT expired without a refresh: new token, reconnect at once, resume */
  TOKEN_EXPIRED: 4401;
}>;

/** How the client reaches the replicas (SPEC 5.9). */
export type TransportName = "websocket" | "sse";

export declare const Transport: Readonly<{
  AUTO: "auto";
  WEBSOCKET: "websocket";
  SSE: "sse";
}>;

/** SPEC 5.9: websocket opens that fail in a row before "auto" switches to SSE (2). */
export declare const FAILED_OPENS_BEFORE_SSE: number;

/** The connection's state. */
export type ConnectionState = "connecting" | "live" | "reconnecting" | "stopped";

export declare const State: Readonly<{
  CONNECTING: "connecting";
  LIVE: "live";
  RECONNECTING: "reconnecting";
  STOPPED: "stopped";
}>;

export interface Timing {
  /** first reconnect delay ceiling in ms; doubles with each failed attempt (500) */
  base: number;
  /** the reconnect delay ceiling never grows beyond this (30000) */
  cap: number;
  /** the lowest delay after close 1013 (5000) */
  overloadMinimum: number;
  /** a connection open this long resets the backoff (10000) */
  stableAfter: number;
  /** a socket not open after this long is abandoned and retried; 0 = never (15000) */
  connectTimeout: number;
}

export declare const DEFAULTS: Readonly<Timing>;

/** Error codes (with an id) after which the subscription ends. */
export declare const ENDING_ERROR_CODES: readonly string[];

/** SPEC 5.7: a frame from the tab larger than this closes the socket with 1009. */
export declare const MAX_FRAME_BYTES: number;

/** SPEC 5.2 rev 3: at most this many fields in a filter. */
export declare const MAX_FILTER_FIELDS: number;

/** Error codes of SPEC 5.3; a newer server may send others. */
export type ErrorCode =
  | "unauthorized"
  | "forbidden_origin"
  | "unknown_app"
  | "invalid_message"
  | "unknown_channel"
  | "invalid_scope"
  | "not_found"
  | "duplicate_id"
  | "too_many_subscriptions"
  | "too_many_sockets"
  | "rate_limited"
  | "internal"
  /** rev 4: the socket's JWT expired without a refresh (close 4401 follows) */
  | "token_expired"
  /** raised by the client itself: `token()` threw, rejected or gave no string */
  | "token"
  /** raised by the client itself: no socket could be made */
  | "socket"
  | (string & {});

/** Reasons of a `resync` frame (SPEC 5.3), and "invalid" when `validate` refused an update. */
export type ResyncReason =
  | "window"
  | "topic"
  | "oversized"
  | "keys_changed"
  | "access"
  | "invalid"
  | (string & {});

/** An error frame. */
export interface LiveError {
  code: ErrorCode;
  message: string;
}

/** A JSON scalar: the values a filter compares with. */
export type FilterValue = string | number | boolean | null;

/** Equality on top-level fields of an update's data: at most 8 fields (SPEC 5.2 rev 3). */
export type Filter = Readonly<Record<string, FilterValue>>;

export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** A subscription's scope: an object the channel's JSON Schema checks. */
export type Scope = { readonly [key: string]: JsonValue };

/** What `stateInfo` holds: for "reconnecting" the close and the backoff, for "stopped" the close. */
export interface StateInfo {
  /** the close code (null when no socket could be made) */
  code?: number | null;
  reason?: string;
  /** the failed attempts before this one ("reconnecting") */
  attempt?: number;
  /** ms until the next attempt ("reconnecting") */
  delay?: number;
  /**
   * the last socket-level error frame (e.g. unauthorized before 1008, token_expired before 4401),
   * or the exception of the socket's constructor or of `token()` (reason "token() failed")
   */
  error?: LiveError | unknown;
  /** the id of the subscription whose invalid scope closed the socket (it ended; the others resume) */
  invalidScope?: string;
  /** "sse" on the "reconnecting" that switched "auto" to Server-Sent Events */
  transport?: TransportName;
}

export interface UpdateMeta {
  key: string;
  cursor: string;
}

export interface SubscribedInfo {
  cursor: string;
  /** whether this connection's sub carried a cursor; false: load the state now */
  resumed: boolean;
}

export interface ResyncInfo {
  reason: ResyncReason;
  cursor: string;
  /** what `validate` threw, for reason "invalid" */
  error?: unknown;
}

export interface RevokedInfo {
  reason: "access_denied" | (string & {});
}

export interface SubscriptionError extends LiveError {
  /** true when the subscription ended (retrying the same sub cannot help) */
  ended: boolean;
}

export interface SubscribeOptions<T = unknown> {
  channel: string;
  /** default {} */
  scope?: Scope;
  /** only updates whose data has these top-level field values are sent (at most 8, scalars) */
  filter?: Filter | null;
  /** resume after this cursor, e.g. one read by server-side rendering before its snapshot */
  cursor?: string | null;
  onSubscribed?: (info: SubscribedInfo) => void;
  onUpdate?: (data: T, meta: UpdateMeta) => void;
  onResync?: (info: ResyncInfo) => void;
  onRevoked?: (info: RevokedInfo) => void;
  onError?: (error: SubscriptionError) => void;
  /** before onUpdate; false or a throw turns the update into onResync({reason: "invalid"}) */
  validate?: ((data: unknown) => data is T) | ((data: unknown) => boolean | void);
}

export declare class Subscription<T = unknown> {
  private constructor();
  /** chosen by the client, unique on it, 1-64 characters */
  readonly id: string;
  readonly channel: string;
  readonly scope: Scope;
  /** the equality filter sent with the sub, or null */
  readonly filter: Filter | null;
  /** the position the subscription resumes from: the last cursor seen, or the initial one */
  readonly cursor: string | null;
  /** false once unsubscribed, revoked, ended by an error, or the client is closed */
  readonly active: boolean;
  /** Ends the subscription (sends unsub when the server knows it). Idempotent. */
  unsubscribe(): void;
}

/** A WebSocket constructor: the browser's, or e.g. the `ws` package's in Node. */
export type WebSocketConstructor = new (url: string) => {
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: any) => void) | null;
  onmessage: ((event: { data: any }) => void) | null;
  onclose: ((event: { code?: number; reason?: string }) => void) | null;
  onerror: ((event: any) => void) | null;
};

export interface LiveClientOptions extends Partial<Timing> {
  /** ws(s):// URL, a path or http(s) URL resolved against the page, or a function returning one */
  url?: string | URL | (() => string | URL);
  /** instead of url: /api/<app>/live on the page's host */
  app?: string;
  /** default globalThis.WebSocket */
  WebSocket?: WebSocketConstructor;
  /** jitter source in [0, 1) (default Math.random) */
  random?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: any) => void;
  /** receives what your callbacks throw (default reportError or console.error) */
  reportError?: (error: unknown) => void;
  /** subscription ids are this prefix plus a counter (default "s", at most 32 characters) */
  idPrefix?: string;
  /**
   * SPEC 5.1 rev 4: returns a JWT (e.g. your identity provider's getToken()). Called after each
   * socket opens, its result sent as the first message `{"type":"auth","token":…}` before any sub
   * (never in the URL); called again on `auth_expiring` (sent on the open socket, subscriptions
   * kept), and for every new socket (after 4401, 1011, …), so never cached across reconnects.
   * A throw, a rejection or a result that is not a non-empty string is a failed open: reported
   * to onError as code "token", then retried with backoff.
   */
  token?: () => string | Promise<string>;
  /**
   * SPEC 5.9. "auto" (default): websocket; after two websocket opens in a row that fail (never
   * opened, or closed 1006 before any frame; not counted while navigator.onLine is false) Server-Sent Events for the rest of the tab's session
   * (sessionStorage, else memory). "sse": only SSE. "websocket": never SSE.
   * SSE is a streaming fetch of /api/<app>/live/sse with cookies: GET with the subs in the URL, or
   * POST with `{subs, token}` when `token` is given.
   */
  transport?: "auto" | TransportName;
  /** the fetch SSE uses (default globalThis.fetch); "auto" without one never leaves websocket */
  fetch?: (url: string, init: any) => Promise<any>;
}

export declare class LiveClient {
  /** Connects at once; throws when there is no WebSocket implementation (transport "sse": no fetch) or the URL is invalid. */
  constructor(options: LiveClientOptions);
  readonly state: ConnectionState;
  readonly stateInfo: Readonly<StateInfo>;
  /** the transport of the current (or next) connection */
  readonly transport: TransportName;
  /** the active subscriptions */
  readonly subscriptions: Subscription[];
  /** Calls listener now and on every change; returns a remover. */
  onState(listener: (state: ConnectionState, info: Readonly<StateInfo>) => void): () => void;
  /** Error frames without an id (e.g. unauthorized, rate_limited); returns a remover. */
  onError(listener: (error: LiveError) => void): () => void;
  /** Throws on invalid options (an invalid filter included), after close(), and for a sub frame over 16 KiB. */
  subscribe<T = unknown>(options: SubscribeOptions<T>): Subscription<T>;
  /** Reconnects now with a fresh backoff (e.g. after "stopped" once the user signed in again). */
  reconnect(): void;
  /** Closes for good: every subscription ends, no callback runs afterwards. */
  close(): void;
}

/** The delay before reconnect attempt `attempt`, full jitter over [minimum, min(cap, base * 2^attempt)). */
export declare function reconnectDelay(
  attempt: number,
  options?: { base?: number; cap?: number; minimum?: number; random?: () => number },
): number;

/** The first attempt whose ceiling reaches twice `minimum` (where 1013 starts the backoff). */
export declare function overloadAttempt(options?: { base?: number; minimum?: number }): number;

/** Checks a filter as subscribe() does; returns a copy, or null for no filter. Throws TypeError/RangeError. */
export declare function checkFilter(filter: unknown): Record<string, FilterValue> | null;
