// Test doubles shared by the client's tests: fake timers and an in-memory WebSocket through which
// the test plays the server's side of the protocol (SPEC 5.2, 5.3).
import { LiveClient } from "../outlive.js";

// --- fakes -----------------------------------------------------------------------------------

/** Timers that run only when the test advances the clock. */
export class FakeClock {
  now = 0;
  #next = 1;
  #timers = new Map(); // id -> {at, fn, ms}

  setTimeout = (fn, ms = 0) => {
    const id = this.#next++;
    this.#timers.set(id, { at: this.now + ms, fn, ms });
    return id;
  };

  clearTimeout = (id) => {
    this.#timers.delete(id);
  };

  /** the delays of the pending timers, in the order they were set */
  get pending() {
    return [...this.#timers.values()].map((t) => t.ms);
  }

  /** Runs every timer due within `ms`, in time order (timers set meanwhile included). */
  advance(ms) {
    const end = this.now + ms;
    for (;;) {
      let due = null;
      for (const [id, t] of this.#timers) {
        if (t.at <= end && (due === null || t.at < due[1].at)) due = [id, t];
      }
      if (due === null) break;
      this.#timers.delete(due[0]);
      this.now = due[1].at;
      due[1].fn();
    }
    this.now = end;
  }
}

/** An in-memory WebSocket: the test plays the server through serverOpen/serverSend/serverClose. */
export function fakeWebSocketClass() {
  return class FakeWebSocket {
    static instances = [];
    url;
    sent = [];
    closedWith = null; // set when the client closes the socket
    onopen = null;
    onmessage = null;
    onclose = null;
    onerror = null;

    constructor(url) {
      this.url = url;
      FakeWebSocket.instances.push(this);
    }

    send(text) {
      if (this.closedWith) throw new Error("InvalidStateError: the socket is closed");
      this.sent.push(JSON.parse(text));
    }

    close(code, reason) {
      this.closedWith = { code, reason };
    }

    serverOpen() {
      this.onopen?.({ type: "open" });
    }

    serverSend(frame) {
      this.onmessage?.({ type: "message", data: typeof frame === "string" ? frame : JSON.stringify(frame) });
    }

    serverClose(code, reason = "") {
      this.onerror?.({ type: "error" });
      this.onclose?.({ type: "close", code, reason, wasClean: code !== 1006 });
    }

    /** frames of one type sent by the client */
    frames(type) {
      return this.sent.filter((f) => f.type === type);
    }

    static get last() {
      return FakeWebSocket.instances.at(-1);
    }
  };
}

export function setup(options = {}) {
  const clock = new FakeClock();
  const WS = fakeWebSocketClass();
  const reported = [];
  const client = new LiveClient({
    url: "ws://test.invalid/api/inventory/live",
    WebSocket: WS,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    random: () => 0.5,
    reportError: (e) => reported.push(e),
    // The websocket path's own policy; "auto" (the default) and SSE: sse.test.mjs.
    transport: "websocket",
    ...options,
  });
  const states = [];
  client.onState((s) => states.push(s));
  return { clock, WS, client, states, reported };
}

/** A subscription whose callbacks record what they receive. */
export function recordingSub(client, options = {}) {
  const calls = { updates: [], resyncs: [], revoked: [], errors: [], subscribed: [] };
  const sub = client.subscribe({
    channel: "warehouse",
    scope: { warehouse: "north" },
    onUpdate: (data, meta) => calls.updates.push({ data, ...meta }),
    onResync: (info) => calls.resyncs.push(info),
    onRevoked: (info) => calls.revoked.push(info),
    onError: (info) => calls.errors.push(info),
    onSubscribed: (info) => calls.subscribed.push(info),
    ...options,
  });
  return { sub, calls };
}

/**
 * An in-memory fetch for SSE streams (SPEC 5.9): each call waits until the test answers it with
 * respond(status); then send/sendClose/end play the server's side of the stream.
 */
export function fakeFetch() {
  const encoder = new TextEncoder();
  const calls = [];
  const fetch = (url, init = {}) =>
    new Promise((resolve, reject) => {
      const u = new URL(url);
      const body = init.body ? JSON.parse(init.body) : null;
      const subs = body ? body.subs : JSON.parse(Buffer.from(u.searchParams.get("subs"), "base64url").toString("utf8"));
      let controller = null;
      const call = {
        url,
        init,
        body,
        subs,
        aborted: false,
        respond(status = 200, text = "") {
          if (status !== 200) {
            resolve(new Response(text, { status }));
            return;
          }
          const stream = new ReadableStream({ start: (c) => { controller = c; } });
          resolve(new Response(stream, { status: 200, headers: { "content-type": "text/event-stream" } }));
        },
        raw(text) {
          controller.enqueue(encoder.encode(text));
        },
        send(frame) {
          this.raw(`data: ${JSON.stringify(frame)}\n\n`);
        },
        sendClose(code, reason = "") {
          this.raw(`event: close\ndata: ${JSON.stringify({ code, reason })}\n\n`);
          controller.close();
        },
        end() {
          controller.close();
        },
      };
      init.signal?.addEventListener("abort", () => {
        call.aborted = true;
        const error = new DOMException("aborted", "AbortError");
        try {
          controller?.error(error);
        } catch {
          // already closed
        }
        reject(error);
      });
      calls.push(call);
    });
  return {
    fetch,
    calls,
    get last() {
      return calls.at(-1);
    },
  };
}

/** Lets the fetch promises and stream reads that are ready run (no clock involved). */
export async function settle() {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
}
