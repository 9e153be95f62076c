// Declarations of @outlive/server (index.js). docs/TYPESCRIPT.md is the reference.
import type { z } from "zod";

/** A reader of a key, as on an API request (SPEC 5.1). */
export interface LiveViewer {
  /** `user:<id>` or `service_account:<id>`, plus `:app` and the credential's scopes. */
  id: string;
  actor: string;
  accessSubject: string;
  scopes: string[] | null;
}

/**
 * A transaction to publish in: a node-postgres `Client`/`PoolClient` inside `BEGIN`, or the `tx` of
 * postgres.js's `sql.begin(async (tx) => ...)`. Told apart by shape: postgres.js's is a function with
 * `.unsafe()`, node-postgres's an object with `.query()`.
 */
export type LiveTransaction =
  | { query(text: string, values?: unknown[]): Promise<unknown> }
  | (((...args: any[]) => any) & { unsafe(text: string, params?: unknown[]): PromiseLike<unknown> });

/** Anything wake() can run one statement on: a pg Pool or Client, postgres.js's sql or a tx. */
export type LiveDatabase = LiveTransaction;

export interface PublishOptions<D> {
  /** 1 to 600 characters: the unit that authorize() decides. */
  key: string;
  /** Validated in its JSON form against `event`; optional only with `access: true`. */
  data?: D;
  /** An access update for the key (SPEC 2.3), written as its own row before the data row. */
  access?: boolean;
  /** Updates of one transaction with the same coalesce key are written once, with the last data. */
  coalesceKey?: string | null;
}

export interface CursorOptions {
  /** The replica's (or gateway's) base URL, e.g. `http://127.0.0.1:8080`. */
  url: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  fetch?: typeof globalThis.fetch;
}

export interface LiveChannel<S extends z.ZodType = z.ZodType> {
  /** Validates the scope a tab sends; printed as JSON Schema by replicaConfig(). */
  scope: S;
  /** The keys the subscription follows, or null when the resource does not exist or the viewer may not read it. */
  keys(scope: z.output<S>, viewer: LiveViewer): Promise<readonly string[] | null> | readonly string[] | null;
  /** The ids of the viewers (up to 500 at once) who may read key. */
  authorize(key: string, viewers: readonly LiveViewer[]): Promise<readonly string[]> | readonly string[];
  /** The key set can change without an update: keys() runs again every minute and after access updates. */
  collection?: boolean;
}

export type LiveChannels = Record<string, LiveChannel<any>>;

/** One credential the replica could not verify itself (SPEC 5.1, `auth.hook`). */
export interface LiveCredential {
  ref: string;
  headers: Record<string, string>;
  origin?: string | null;
  address?: string | null;
  [field: string]: unknown;
}

export type AuthenticateResult =
  | { viewer: Partial<LiveViewer> & { id: string }; expiresInS?: number }
  | { refused: string }
  | null;

export interface RoutesOptions {
  /** The contents of the replica's `hook_secret_file`; a list during a rotation. */
  secret: string | Uint8Array | ReadonlyArray<string | Uint8Array>;
  /** Answers the credential hook; without it that hook is answered 404. */
  authenticate?: (credential: LiveCredential) => Promise<AuthenticateResult> | AuthenticateResult;
  /** Called with what a channel function threw (the replica gets a 500). Default console.error. */
  onError?: (error: unknown) => void;
  /** Default 4 MiB. */
  maxBodyBytes?: number;
  /** The clock, in milliseconds (tests). */
  now?: () => number;
}

export interface ReplicaConfigOptions {
  /** Where routes() is mounted, as the replica reaches it (http:// or https://). */
  url: string;
  /** The hook's timeout, 1..10000 ms (the replica's default is 2,000). */
  timeoutMs?: number;
  allowedOrigins?: string[];
  /** Path of the event schema file, relative to the configuration file. */
  eventSchema?: string;
}

/** A JSON Schema (draft 7) as a plain object. */
export type JsonSchema = Record<string, unknown>;

/** The value of `apps.<appId>` in the replica's configuration. */
export interface AppSection {
  allowed_origins?: string[];
  event_schema?: string;
  channels: Record<string, { collection?: true; scope: JsonSchema; hook: { url: string; timeout_ms?: number } }>;
}

export type LiveHandler = (request: Request) => Promise<Response>;

export interface LiveDefinition<E extends z.ZodType> {
  readonly appId: string;
  readonly event: E;
  /** Validates `data` and writes the update in the caller's transaction. Throws LiveValidationError. */
  publish(tx: LiveTransaction, update: PublishOptions<z.input<E>>): Promise<void>;
  /** publish(tx, {key, data, access: true}). */
  publishAccess(tx: LiveTransaction, key: string, data?: z.input<E>): Promise<void>;
  /** After the commit: asks the replicas to publish now (events.wake). */
  wake(db: LiveDatabase): Promise<void>;
  /** The topic's current cursor from a replica's GET /api/<app>/live/cursor. Read it before the snapshot. */
  cursor(options: CursorOptions): Promise<string>;
  /** A Fetch-API handler answering the replica's channel hooks (and the credential hook with `authenticate`). */
  routes(channels: LiveChannels, options: RoutesOptions): LiveHandler;
  /** The app's section of the replica configuration: each channel's scope as JSON Schema and its hook URL. */
  replicaConfig(channels: LiveChannels, options: ReplicaConfigOptions): AppSection;
  /** The event schema as JSON Schema (draft 7), e.g. for schemas/<app>.event.json. */
  eventJsonSchema(): JsonSchema;
}

export function defineLive<E extends z.ZodType>(options: { appId: string; event: E }): LiveDefinition<E>;

/** Returns its argument; types keys()'s scope from the channel's zod schema. */
export function channel<S extends z.ZodType>(definition: LiveChannel<S>): LiveChannel<S>;

export class LiveValidationError extends Error {
  readonly name: "LiveValidationError";
  /** zod's issues, or the places that JSON cannot carry. */
  readonly issues: ReadonlyArray<{ path: ReadonlyArray<PropertyKey>; message: string }>;
}

/** The Outlive-Signature header for `body` at `t` (unix seconds, default now). */
export function signHookBody(secret: string | Uint8Array, body: string | Uint8Array, t?: number): string;

/** null when `header` signs `body` within the window, else the reason. */
export function verifySignature(
  header: string | null | undefined,
  body: string | Uint8Array,
  secret: string | Uint8Array | ReadonlyArray<string | Uint8Array>,
  options?: { now?: number; toleranceS?: number },
): string | null;

export const SIGNATURE_HEADER: "Outlive-Signature";
export const SIGNATURE_TOLERANCE_S: 300;
export const MAX_KEY_CHARS: 600;
export const MAX_DATA_BYTES: 32768;
export const MAX_HOOK_BODY_BYTES: number;
