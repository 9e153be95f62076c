// useLive: one outlive subscription for the life of a React component (@outlive/client/react).
//
// The LiveClient already resends every active sub with its last cursor after a reconnect; the hook
// adds what a component needs on top: subscribe on mount, unsubscribe on unmount, a status to
// render, and a `load` that runs whenever the data must be (re)loaded. When the component keeps
// its identity but the subscription must be made again (another LiveClient, React's StrictMode
// remount), the new sub resumes from the last cursor so nothing is missed and nothing reloads.

import { useCallback, useEffect, useRef, useState } from "react";

const IDLE = Object.freeze({
  status: "connecting",
  cursor: null,
  lastUpdate: null,
  resync: null,
  error: null,
  subscription: null,
});

/**
 * @param {import("./outlive.js").LiveClient | null | undefined} client
 * @param {import("./react.js").UseLiveOptions<any> | null | undefined} options
 * @returns {import("./react.js").LiveResult<any>}
 */
export function useLive(client, options) {
  const enabled = client != null && options != null && options.enabled !== false;
  // Only what the server sees starts a new subscription; callbacks may change on every render.
  const key = enabled
    ? JSON.stringify([options.channel, options.scope ?? {}, options.filter ?? null])
    : null;

  const latest = useRef(options);
  latest.current = options;
  /** the last position of `key`, kept across re-subscriptions of this component */
  const resume = useRef({ key: null, cursor: null, stale: false });
  const control = useRef(null);
  const [state, setState] = useState(IDLE);

  useEffect(() => {
    if (!enabled) {
      setState(IDLE);
      return undefined;
    }
    const opts = latest.current;
    const same = resume.current.key === key;
    // options.cursor belongs to the first subscription (e.g. server-side rendering's); another
    // channel, scope or filter is another data set that has to be loaded from scratch.
    const startCursor = same ? resume.current.cursor : resume.current.key === null ? (opts.cursor ?? null) : null;
    const f = {
      alive: true,
      confirmed: false,
      stale: same && resume.current.stale,
      revoked: null,
      ended: null,
      stopped: null,
      loadError: null,
      cursor: startCursor,
      lastUpdate: null,
      resync: null,
      subscription: null,
      loadGen: 0,
      abort: null,
    };
    const user = (name, ...args) => {
      const fn = latest.current?.[name];
      if (typeof fn === "function") fn(...args);
    };

    const publish = () => {
      if (!f.alive) return;
      const error = f.ended ?? f.stopped ?? f.loadError;
      const status = f.revoked ? "revoked" : error ? "error" : f.stale ? "resyncing" : f.confirmed ? "live" : "connecting";
      setState((prev) => ({
        status,
        cursor: f.cursor,
        // the same data set after a re-subscription keeps showing its last update
        lastUpdate: f.lastUpdate ?? (same ? prev.lastUpdate : null),
        resync: f.resync ?? (same ? prev.resync : null),
        error: error ?? null,
        subscription: f.subscription,
      }));
    };
    const remember = (cursor) => {
      if (typeof cursor === "string") f.cursor = cursor;
      resume.current = { key, cursor: f.cursor, stale: f.stale };
    };
    const load = (info) => {
      f.stale = true;
      remember();
      const loader = latest.current?.load;
      if (typeof loader !== "function") return; // resynced() ends "resyncing"
      f.abort?.abort();
      const abort = (f.abort = new AbortController());
      const gen = ++f.loadGen;
      const done = (loadError) => {
        if (!f.alive || gen !== f.loadGen) return; // a newer load owns the status
        f.loadError = loadError;
        if (!loadError) f.stale = false;
        remember();
        publish();
      };
      let result;
      try {
        result = loader({ reason: info.reason, cursor: info.cursor, signal: abort.signal });
      } catch (error) {
        return done(loadFailure(error));
      }
      Promise.resolve(result).then(
        () => done(null),
        (error) => done(loadFailure(error)),
      );
    };
    const ctl = {
      resynced() {
        if (!f.alive || !f.stale) return;
        f.stale = false;
        f.loadError = null;
        remember();
        publish();
      },
    };
    control.current = ctl;

    const offState = client.onState((connection, info) => {
      if (connection !== "live") f.confirmed = false; // until the resent sub is answered
      f.stopped = connection === "stopped" ? stoppedError(info) : null;
      publish();
    });

    try {
      f.subscription = client.subscribe({
        channel: opts.channel,
        scope: opts.scope ?? {},
        filter: opts.filter ?? null,
        cursor: f.cursor,
        validate: (data) => {
          const v = latest.current?.validate;
          return typeof v === "function" ? v(data) : true;
        },
        onSubscribed(info) {
          f.confirmed = true;
          remember(info.cursor);
          if (!info.resumed) {
            // no cursor was sent: the data must be loaded after this position
            if (typeof latest.current?.load === "function") load({ reason: "initial", cursor: info.cursor });
          } else if (f.stale) {
            load({ reason: "resumed", cursor: info.cursor }); // a load cut short by the re-subscription
          }
          publish();
          user("onSubscribed", info);
        },
        onUpdate(data, meta) {
          f.confirmed = true;
          remember(meta.cursor);
          f.lastUpdate = { data, key: meta.key, cursor: meta.cursor };
          publish();
          user("onUpdate", data, meta);
        },
        onResync(info) {
          f.confirmed = true;
          remember(info.cursor);
          f.resync = { reason: info.reason, cursor: info.cursor };
          load(info);
          publish();
          user("onResync", info);
        },
        onRevoked(info) {
          f.revoked = info;
          publish();
          user("onRevoked", info);
        },
        onError(error) {
          if (error.ended) f.ended = { code: error.code, message: error.message };
          publish();
          user("onError", error);
        },
      });
    } catch (error) {
      f.ended = { code: "invalid_subscription", message: String(error?.message ?? error) };
    }
    publish();

    return () => {
      f.alive = false;
      f.abort?.abort();
      offState();
      const sub = f.subscription;
      // sub.cursor has also followed `progress` frames, which no callback reports
      if (sub) resume.current = { key, cursor: sub.cursor ?? f.cursor, stale: f.stale };
      sub?.unsubscribe();
      if (control.current === ctl) control.current = null;
    };
    // `key` stands for channel, scope and filter; `enabled` is part of it
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [client, key]);

  const resynced = useCallback(() => control.current?.resynced(), []);
  return { ...state, resynced };
}

function loadFailure(error) {
  return { code: "load_failed", message: String(error?.message ?? error), cause: error };
}

function stoppedError(info) {
  const e = info?.error;
  if (e && typeof e.code === "string") return { code: e.code, message: String(e.message ?? "") };
  return { code: "stopped", message: `the connection stopped (close ${info?.code ?? "none"}${info?.reason ? `: ${info.reason}` : ""})` };
}
