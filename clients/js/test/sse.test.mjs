// The SSE transport (SPEC 5.9) and "auto"'s fallback to it, against an in-memory WebSocket, an
// in-memory fetch and fake timers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LiveClient } from "../outlive.js";
import { setup, recordingSub, fakeFetch, settle } from "./fakes.mjs";

let hosts = 0;
// "auto" remembers its choice per URL for the page's lifetime: a fresh host keeps tests apart.
function freshUrl() {
  return `ws://t${++hosts}.invalid/api/inventory/live`;
}

function sseSetup(options = {}) {
  const f = fakeFetch();
  const s = setup({ url: freshUrl(), fetch: f.fetch, transport: "sse", ...options });
  return { ...s, f };
}

async function liveStream(f, frames = []) {
  f.last.respond(200);
  await settle();
  for (const frame of frames) f.last.send(frame);
  await settle();
}

test("auto falls back to SSE after two websocket opens fail in a row, not after one", async () => {
  const f = fakeFetch();
  const { WS, client, clock, states } = setup({ url: freshUrl(), fetch: f.fetch, transport: "auto" });
  const { sub, calls } = recordingSub(client);
  assert.equal(client.transport, "websocket");

  WS.last.serverClose(1006); // refused upgrade: never opened
  assert.equal(client.transport, "websocket", "one failed open is not enough");
  assert.equal(f.calls.length, 0);
  clock.advance(client.stateInfo.delay);
  assert.equal(WS.instances.length, 2);

  WS.last.serverClose(1006);
  assert.equal(client.transport, "sse");
  assert.equal(WS.instances.length, 2, "no third websocket");
  await settle();
  assert.equal(f.calls.length, 1, "the stream is opened at once");
  const call = f.last;
  assert.equal(call.init.method, "GET");
  assert.equal(call.init.credentials, "include");
  assert.match(call.url, /^http:\/\/t\d+\.invalid\/api\/inventory\/live\/sse\?subs=/);
  assert.deepEqual(call.subs, [{ type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" } }]);

  await liveStream(f, [
    { type: "subscribed", id: sub.id, cursor: "c0" },
    { type: "update", ids: [sub.id], key: "K", cursor: "c1", data: { qty: 1 } },
  ]);
  assert.equal(client.state, "live");
  assert.deepEqual(calls.updates, [{ data: { qty: 1 }, key: "K", cursor: "c1" }]);
  assert.deepEqual(states.slice(-1), ["live"]);
  client.close();
});

test("auto: an open socket between two failed opens breaks the row", async () => {
  const f = fakeFetch();
  const { WS, client, clock } = setup({ url: freshUrl(), fetch: f.fetch, transport: "auto" });
  const { sub } = recordingSub(client);
  WS.last.serverClose(1006);
  clock.advance(client.stateInfo.delay);
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: sub.id, cursor: "c0" });
  WS.last.serverClose(1012);
  clock.advance(client.stateInfo.delay);
  WS.last.serverClose(1006);
  assert.equal(client.transport, "websocket");
  assert.equal(f.calls.length, 0);
  // a socket that opens but is cut (1006) before any frame is a failed open too (a middlebox)
  clock.advance(client.stateInfo.delay);
  WS.last.serverOpen();
  WS.last.serverClose(1006);
  assert.equal(client.transport, "sse");
  await settle();
  assert.equal(f.calls.length, 1);
  client.close();
});

test("auto: opens that fail while the browser is offline do not count towards the fallback", async () => {
  const f = fakeFetch();
  const { WS, client, clock } = setup({ url: freshUrl(), fetch: f.fetch, transport: "auto" });
  recordingSub(client);
  const had = Object.getOwnPropertyDescriptor(globalThis, "navigator");
  Object.defineProperty(globalThis, "navigator", { value: { onLine: false }, configurable: true, writable: true });
  try {
    WS.last.serverClose(1006);
    for (let i = 0; i < 3; i++) {
      clock.advance(client.stateInfo.delay);
      WS.last.serverClose(1006);
    }
    assert.equal(client.transport, "websocket", "four opens failed while offline");
    assert.equal(f.calls.length, 0);
    globalThis.navigator.onLine = true; // back online: two failed opens in a row count again
    clock.advance(client.stateInfo.delay);
    WS.last.serverClose(1006);
    assert.equal(client.transport, "websocket");
    clock.advance(client.stateInfo.delay);
    WS.last.serverClose(1006);
    assert.equal(client.transport, "sse");
  } finally {
    if (had) Object.defineProperty(globalThis, "navigator", had);
    else delete globalThis.navigator;
  }
  client.close();
});

test("the choice is remembered for the tab: the next client on the same URL starts with SSE", async () => {
  const f = fakeFetch();
  const url = freshUrl();
  const first = setup({ url, fetch: f.fetch, transport: "auto" });
  first.WS.last.serverClose(1006);
  first.clock.advance(first.client.stateInfo.delay);
  first.WS.last.serverClose(1006);
  assert.equal(first.client.transport, "sse");
  await settle();
  first.client.close();

  const second = setup({ url, fetch: f.fetch, transport: "auto" });
  assert.equal(second.client.transport, "sse");
  assert.equal(second.WS.instances.length, 0, "no websocket is tried again");
  await settle();
  assert.equal(f.calls.length, 2);
  second.client.close();

  // transport "websocket" is never switched, remembered or not
  const third = setup({ url, fetch: f.fetch, transport: "websocket" });
  assert.equal(third.client.transport, "websocket");
  assert.equal(third.WS.instances.length, 1);
  third.client.close();
});

test("the choice is kept in sessionStorage when there is one", () => {
  const store = new Map();
  globalThis.sessionStorage = {
    getItem: (k) => (store.has(k) ? store.get(k) : null),
    setItem: (k, v) => store.set(k, String(v)),
  };
  try {
    const f = fakeFetch();
    const url = freshUrl();
    const a = setup({ url, fetch: f.fetch, transport: "auto" });
    a.WS.last.serverClose(1006);
    a.clock.advance(a.client.stateInfo.delay);
    a.WS.last.serverClose(1006);
    a.client.close();
    assert.deepEqual([...store.values()], ["sse"]);
    assert.ok([...store.keys()][0].includes(url));

    // what a reloaded tab finds: only the storage knows
    const other = freshUrl();
    store.set([...store.keys()][0].replace(url, other), "sse");
    const b = setup({ url: other, fetch: f.fetch, transport: "auto" });
    assert.equal(b.client.transport, "sse");
    assert.equal(b.WS.instances.length, 0);
    b.client.close();
  } finally {
    delete globalThis.sessionStorage;
  }
});

test("a new subscription opens the new stream before closing the old one: nothing lost, nothing twice", async () => {
  const { client, clock, f } = sseSetup();
  const a = recordingSub(client);
  await settle();
  assert.equal(f.calls.length, 1);
  await liveStream(f, [
    { type: "subscribed", id: a.sub.id, cursor: "c0" },
    { type: "update", ids: [a.sub.id], key: "K", cursor: "c1", data: { n: 1 } },
  ]);
  const old = f.calls[0];

  const b = recordingSub(client, { scope: { warehouse: "south" } });
  const c = recordingSub(client, { scope: { warehouse: "east" } });
  clock.advance(0);
  await settle();
  assert.equal(f.calls.length, 2, "one new stream for both new subs");
  const next = f.calls[1];
  assert.deepEqual(next.subs.map((s) => [s.id, s.cursor]), [[a.sub.id, "c1"], [b.sub.id, undefined], [c.sub.id, undefined]]);
  assert.equal(old.aborted, false, "the old stream stays until the new one answers");

  // the old stream keeps delivering meanwhile
  old.send({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: { n: 2 } });
  await settle();
  assert.deepEqual(a.calls.updates.map((u) => u.cursor), ["c1", "c2"]);

  next.respond(200);
  await settle();
  assert.equal(old.aborted, true, "closed once the new one answered");
  assert.equal(client.state, "live");
  // the new stream replays from c1: c2 again (skipped), then c3 (new)
  next.send({ type: "subscribed", id: a.sub.id, cursor: "c1" });
  assert.equal(a.sub.cursor, "c2", "the replay's start does not move the cursor back");
  next.send({ type: "subscribed", id: b.sub.id, cursor: "c2" });
  next.send({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: { n: 2 } });
  next.send({ type: "update", ids: [a.sub.id, b.sub.id], key: "K", cursor: "c3", data: { n: 3 } });
  await settle();
  assert.deepEqual(a.calls.updates.map((u) => u.cursor), ["c1", "c2", "c3"]);
  assert.deepEqual(b.calls.updates.map((u) => u.cursor), ["c3"]);
  assert.equal(a.sub.cursor, "c3");

  // unsubscribing also makes a new stream, without that sub
  c.sub.unsubscribe();
  clock.advance(0);
  await settle();
  assert.equal(f.calls.length, 3);
  assert.deepEqual(f.calls[2].subs.map((s) => s.id), [a.sub.id, b.sub.id]);
  assert.equal(next.aborted, false);
  client.close();
  await settle();
  assert.equal(next.aborted, true);
  assert.equal(f.calls[2].aborted, true);
});

test("a stream that ends while its replacement opens hands over to the replacement", async () => {
  const { client, clock, f } = sseSetup();
  const a = recordingSub(client);
  await settle();
  await liveStream(f, [{ type: "subscribed", id: a.sub.id, cursor: "c0" }]);
  recordingSub(client, { scope: { warehouse: "south" } });
  clock.advance(0);
  await settle();
  f.calls[0].send({ type: "update", ids: [a.sub.id], key: "K", cursor: "c1", data: { n: 1 } });
  f.calls[0].sendClose(1012, "rotated");
  await settle();
  assert.equal(client.state, "reconnecting");
  assert.equal(f.calls.length, 2, "no third stream: the pending one carries every sub");
  f.calls[1].respond(200);
  await settle();
  assert.equal(client.state, "live");
  f.calls[1].send({ type: "update", ids: [a.sub.id], key: "K", cursor: "c1", data: { n: 1 } });
  f.calls[1].send({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: { n: 2 } });
  await settle();
  assert.deepEqual(a.calls.updates.map((u) => u.cursor), ["c1", "c2"]);
  client.close();
});

test("after an SSE reconnect every sub resumes from its own cursor", async () => {
  const { client, clock, f } = sseSetup();
  const a = recordingSub(client);
  const b = recordingSub(client, { scope: { warehouse: "south" } });
  await settle();
  await liveStream(f, [
    { type: "subscribed", id: a.sub.id, cursor: "c0" },
    { type: "subscribed", id: b.sub.id, cursor: "c0" },
    { type: "update", ids: [a.sub.id], key: "K", cursor: "c4", data: { n: 4 } },
    { type: "progress", cursor: "c6" },
  ]);
  assert.equal(a.sub.cursor, "c6");
  f.last.sendClose(1012, "sse_max_seconds");
  await settle();
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1012);
  assert.equal(f.calls.length, 1, "after the backoff, not at once");
  clock.advance(client.stateInfo.delay);
  await settle();
  assert.equal(f.calls.length, 2);
  assert.deepEqual(f.last.subs.map((s) => s.cursor), ["c6", "c6"]);
  await liveStream(f, [
    { type: "subscribed", id: a.sub.id, cursor: "c6" },
    { type: "update", ids: [a.sub.id], key: "K", cursor: "c7", data: { n: 7 } },
  ]);
  assert.deepEqual(a.calls.updates.map((u) => u.cursor), ["c4", "c7"]);
  assert.deepEqual(a.calls.subscribed.at(-1), { cursor: "c6", resumed: true });

  // a stream that just ends (a replica killed) is a reconnect too
  f.last.end();
  await settle();
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1006);
  clock.advance(client.stateInfo.delay);
  await settle();
  assert.deepEqual(f.last.subs.map((s) => s.cursor), ["c7", "c6"]);
  client.close();
});

test("event close 1008 stops; HTTP 401 stops with the error frame", async () => {
  const one = sseSetup();
  recordingSub(one.client);
  await settle();
  await liveStream(one.f);
  one.f.last.send({ type: "error", code: "unauthorized", message: "session ended" });
  one.f.last.sendClose(1008, "unauthorized");
  await settle();
  assert.equal(one.client.state, "stopped");
  assert.equal(one.client.stateInfo.code, 1008);
  assert.deepEqual(one.client.stateInfo.error, { code: "unauthorized", message: "session ended" });
  one.clock.advance(60_000);
  await settle();
  assert.equal(one.f.calls.length, 1);

  const two = sseSetup();
  const errors = [];
  two.client.onError((e) => errors.push(e));
  recordingSub(two.client);
  await settle();
  two.f.last.respond(401, JSON.stringify({ type: "error", code: "unauthorized", message: "no credential" }));
  await settle();
  assert.equal(two.client.state, "stopped");
  assert.equal(two.client.stateInfo.code, 1008);
  assert.deepEqual(errors, [{ code: "unauthorized", message: "no credential" }]);
});

test("event close 1011 and HTTP 503 retry with backoff; 429 waits at least 5 s", async () => {
  const { client, clock, f } = sseSetup();
  recordingSub(client);
  await settle();
  await liveStream(f);
  f.last.sendClose(1011, "access check failed");
  await settle();
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1011);
  clock.advance(client.stateInfo.delay);
  await settle();
  assert.equal(f.calls.length, 2);
  f.last.respond(503, JSON.stringify({ type: "error", code: "internal", message: "stopping" }));
  await settle();
  assert.equal(client.stateInfo.code, 1012);
  clock.advance(client.stateInfo.delay);
  await settle();
  assert.equal(f.calls.length, 3);
  f.last.respond(429, JSON.stringify({ type: "error", code: "too_many_sockets", message: "" }));
  await settle();
  assert.equal(client.stateInfo.code, 1013);
  assert.ok(client.stateInfo.delay >= 5_000, `delay ${client.stateInfo.delay}`);
  client.close();
});

test("with a token the stream is a POST carrying it; 4401 asks token() again and reconnects at once", async () => {
  let n = 0;
  const { client, clock, f } = sseSetup({ token: () => `tok-${++n}` });
  const a = recordingSub(client);
  await settle();
  assert.equal(f.last.init.method, "POST");
  assert.equal(f.last.init.credentials, "include");
  assert.doesNotMatch(f.last.url, /subs=|tok-/);
  assert.equal(f.last.body.token, "tok-1");
  assert.deepEqual(f.last.body.subs.map((s) => s.id), [a.sub.id]);
  await liveStream(f, [{ type: "subscribed", id: a.sub.id, cursor: "c0" }]);
  f.last.sendClose(4401, "token_expired");
  await settle();
  assert.equal(f.calls.length, 2, "no backoff for the first 4401");
  assert.equal(f.last.body.token, "tok-2");
  assert.equal(f.last.body.subs[0].cursor, "c0");

  // auth_expiring: a new stream with a new token replaces the open one, losslessly
  await liveStream(f, [{ type: "subscribed", id: a.sub.id, cursor: "c0" }]);
  f.last.send({ type: "auth_expiring", in_ms: 30_000 });
  await settle();
  clock.advance(0);
  await settle();
  assert.equal(client.state, "live");
  assert.equal(f.calls.length, 3);
  assert.equal(f.last.body.token, "tok-3");
  assert.equal(f.calls[1].aborted, false, "the old stream stays until the new one answers");
  client.close();
});

test("events split across chunks, CRLF line ends and ping comments are read as one frame each", async () => {
  const { client, clock, f } = sseSetup();
  const a = recordingSub(client);
  await settle();
  await liveStream(f, [{ type: "subscribed", id: a.sub.id, cursor: "c0" }]);
  const text = `data: ${JSON.stringify({ type: "update", ids: [a.sub.id], key: "K", cursor: "c1", data: { s: "é\n" } })}\r\n\r\n`;
  f.last.raw(": ping\r\n\r\n");
  f.last.raw(text.slice(0, 7));
  await settle();
  f.last.raw(text.slice(7, -1));
  await settle();
  assert.equal(a.calls.updates.length, 0, "not before the blank line ends the event");
  f.last.raw(text.slice(-1));
  await settle();
  assert.deepEqual(a.calls.updates, [{ data: { s: "é\n" }, key: "K", cursor: "c1" }]);

  // a stream silent for three missed pings is dropped and resumed
  clock.advance(44_000);
  await settle();
  assert.equal(client.state, "live");
  f.last.raw(": ping\n\n");
  await settle();
  clock.advance(44_000);
  await settle();
  assert.equal(client.state, "live", "a ping keeps the stream");
  clock.advance(1_000);
  await settle();
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1006);
  assert.equal(f.calls[0].aborted, true);
  clock.advance(client.stateInfo.delay);
  await settle();
  assert.equal(f.calls.length, 2);
  assert.equal(f.last.subs[0].cursor, "c1");
  client.close();
});
