// Types of @outlive/client/react (react.js).
import type {
  Filter,
  LiveClient,
  LiveError,
  ResyncReason,
  SubscribeOptions,
  Subscription,
} from "./outlive.js";

/**
 * - `connecting`: the sub is not answered yet on the current socket (first connection or a reconnect)
 * - `live`: subscribed; updates arrive
 * - `resyncing`: the data must be (re)loaded: `load` is running, or (without `load`) until `resynced()`
 * - `revoked`: the viewer lost access; the subscription ended
 * - `error`: the subscription ended with an error, the connection stopped (e.g. close 1008), or `load` failed
 */
export type LiveStatus = "connecting" | "live" | "resyncing" | "revoked" | "error";

export interface LoadInfo {
  /** "initial" (subscribed without a cursor), "resumed" (a load cut short), or the resync's reason */
  reason: ResyncReason | "initial" | "resumed";
  /** the position the subscription is live from: load a snapshot that is at least this recent */
  cursor: string;
  /** aborted when a newer load starts or the component unmounts */
  signal: AbortSignal;
}

export interface UseLiveOptions<T = unknown> extends Omit<SubscribeOptions<T>, "filter"> {
  filter?: Filter | null;
  /** (Re)load the data; status is "resyncing" until the promise settles. */
  load?: (info: LoadInfo) => void | Promise<unknown>;
  /** false: no subscription (like passing null options) */
  enabled?: boolean;
}

export interface LiveUpdate<T = unknown> {
  data: T;
  key: string;
  cursor: string;
}

export interface LiveResult<T = unknown> {
  status: LiveStatus;
  /** the last cursor seen by the hook (subscribed, update, resync) */
  cursor: string | null;
  lastUpdate: LiveUpdate<T> | null;
  /** the last resync frame */
  resync: { reason: ResyncReason; cursor: string } | null;
  /** why status is "error" (code "load_failed" carries `cause`) */
  error: (LiveError & { cause?: unknown }) | null;
  subscription: Subscription<T> | null;
  /** Ends "resyncing" when you reload without `load`. */
  resynced: () => void;
}

/**
 * Subscribes on mount (and when client, channel, scope or filter change), unsubscribes on unmount.
 * Callbacks and `load` are read from the latest render; changing them does not resubscribe.
 */
export declare function useLive<T = unknown>(
  client: LiveClient | null | undefined,
  options: UseLiveOptions<T> | null | undefined,
): LiveResult<T>;
