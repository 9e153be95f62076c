// LiveClient against an in-memory WebSocket and fake timers: nothing sleeps, nothing listens.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LiveClient, CloseCode, MAX_FRAME_BYTES } from "../outlive.js";
import { FakeClock, fakeWebSocketClass, setup, recordingSub } from "./fakes.mjs";

// --- tests -----------------------------------------------------------------------------------

test("sends every subscription's sub frame when the socket opens", () => {
  const { WS, client, states } = setup();
  assert.equal(WS.instances.length, 1);
  assert.equal(WS.last.url, "ws://test.invalid/api/inventory/live");
  assert.deepEqual(states, ["connecting"]);

  const a = client.subscribe({ channel: "warehouse", scope: { warehouse: "north" } });
  const b = client.subscribe({ channel: "my_warehouses", cursor: "ssr-cursor-1" });
  assert.deepEqual(WS.last.sent, [], "nothing is sent before the socket opens");

  WS.last.serverOpen();
  assert.deepEqual(states, ["connecting", "live"]);
  assert.deepEqual(WS.last.sent, [
    { type: "sub", id: a.id, channel: "warehouse", scope: { warehouse: "north" } },
    { type: "sub", id: b.id, channel: "my_warehouses", scope: {}, cursor: "ssr-cursor-1" },
  ]);
  assert.notEqual(a.id, b.id);
  for (const id of [a.id, b.id]) assert.ok(id.length >= 1 && id.length <= 64);

  // subscribing while live sends at once, with a fresh id
  const c = client.subscribe({ channel: "warehouse", scope: { warehouse: "south" } });
  assert.deepEqual(WS.last.sent.at(-1), { type: "sub", id: c.id, channel: "warehouse", scope: { warehouse: "south" } });
  assert.equal(new Set([a.id, b.id, c.id]).size, 3);
});

test("subscribed, update and resync reach the subscription and move its cursor", () => {
  const { WS, client } = setup();
  const { sub, calls } = recordingSub(client, { cursor: "c0" });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: sub.id, cursor: "c0" });
  assert.deepEqual(calls.subscribed, [{ cursor: "c0", resumed: true }]);

  WS.last.serverSend({ type: "update", ids: [sub.id], key: "K1", cursor: "c1", data: { qty: 3 } });
  assert.deepEqual(calls.updates, [{ data: { qty: 3 }, key: "K1", cursor: "c1" }]);
  assert.equal(sub.cursor, "c1");

  WS.last.serverSend({ type: "resync", id: sub.id, cursor: "c2", reason: "window" });
  assert.deepEqual(calls.resyncs, [{ reason: "window", cursor: "c2" }]);
  assert.equal(sub.cursor, "c2");
  assert.equal(sub.active, true, "a resync keeps the subscription live");

  WS.last.serverSend({ type: "update", ids: [sub.id], key: "K1", cursor: "c3", data: { qty: 4 } });
  assert.equal(calls.updates.length, 2);
  assert.equal(sub.cursor, "c3");
});

test("a sub without a cursor reports resumed: false (load the state now)", () => {
  const { WS, client } = setup();
  const { sub, calls } = recordingSub(client);
  WS.last.serverOpen();
  assert.equal("cursor" in WS.last.frames("sub")[0], false);
  WS.last.serverSend({ type: "subscribed", id: sub.id, cursor: "head-7" });
  assert.deepEqual(calls.subscribed, [{ cursor: "head-7", resumed: false }]);
  assert.equal(sub.cursor, "head-7");
});

test("one update frame is dispatched to every listed subscription", () => {
  const { WS, client } = setup();
  const one = recordingSub(client);
  const two = recordingSub(client, { scope: { warehouse: "south" } });
  const other = recordingSub(client, { scope: { warehouse: "east" } });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "update", ids: [one.sub.id, two.sub.id, "not-mine"], key: "K", cursor: "c5", data: { n: 1 } });
  assert.deepEqual(one.calls.updates, [{ data: { n: 1 }, key: "K", cursor: "c5" }]);
  assert.deepEqual(two.calls.updates, [{ data: { n: 1 }, key: "K", cursor: "c5" }]);
  assert.deepEqual(other.calls.updates, []);
  assert.equal(other.sub.cursor, null);
});

test("progress moves the cursor of every confirmed subscription on the socket", () => {
  const { WS, client } = setup();
  const a = recordingSub(client);
  const b = recordingSub(client, { scope: { warehouse: "south" } });
  const waiting = recordingSub(client, { scope: { warehouse: "west" }, cursor: "w0" });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: a.sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "subscribed", id: b.sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: {} });
  WS.last.serverSend({ type: "progress", cursor: "c9" });
  assert.equal(a.sub.cursor, "c9");
  assert.equal(b.sub.cursor, "c9");
  // not confirmed yet (still in the server's queue): it has not seen what precedes c9
  assert.equal(waiting.sub.cursor, "w0");
});

test("after a drop it reconnects with backoff and resubscribes from the last cursors", () => {
  const { WS, client, clock, states } = setup();
  const a = recordingSub(client);
  const b = recordingSub(client, { scope: { warehouse: "south" } });
  const first = WS.last;
  first.serverOpen();
  first.serverSend({ type: "subscribed", id: a.sub.id, cursor: "c1" });
  first.serverSend({ type: "subscribed", id: b.sub.id, cursor: "c1" });
  first.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: {} });
  first.serverSend({ type: "progress", cursor: "c3" });
  first.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "c4", data: {} });

  first.serverClose(1006);
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1006);
  assert.equal(WS.instances.length, 1, "no new socket before the delay");
  // random 0.5, attempt 0: half of the 500 ms ceiling
  assert.equal(client.stateInfo.delay, 250);
  clock.advance(249);
  assert.equal(WS.instances.length, 1);
  clock.advance(1);
  assert.equal(WS.instances.length, 2);
  const second = WS.last;
  assert.deepEqual(second.sent, [], "sub frames wait for the open");
  second.serverOpen();
  assert.deepEqual(states, ["connecting", "live", "reconnecting", "live"]);
  assert.deepEqual(
    second.frames("sub").map((f) => [f.id, f.cursor]),
    [
      [a.sub.id, "c4"],
      [b.sub.id, "c3"],
    ],
  );
  // frames still arriving on the old socket are ignored
  first.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "old", data: {} });
  assert.equal(a.sub.cursor, "c4");
  assert.equal(a.calls.updates.length, 2);
});

test("1011 and 1012 reconnect and resume; failed attempts grow the delay; a stable connection resets it", () => {
  const { WS, client, clock } = setup({ random: () => 0.999 });
  const { sub } = recordingSub(client, { cursor: "c1" });
  WS.last.serverOpen();
  WS.last.serverClose(CloseCode.REPLICA_STOPPING);
  const delays = [client.stateInfo.delay];
  for (let i = 0; i < 8; i++) {
    clock.advance(client.stateInfo.delay);
    WS.last.serverClose(i % 2 ? 1006 : CloseCode.ACCESS_CHECK_FAILED); // fails before or right after opening
    delays.push(client.stateInfo.delay);
  }
  assert.deepEqual(delays, [499, 999, 1998, 3996, 7992, 15984, 29970, 29970, 29970]);
  assert.equal(WS.instances.length, 9);

  // a connection that stays open for stableAfter (10 s) resets the backoff
  clock.advance(client.stateInfo.delay);
  WS.last.serverOpen();
  clock.advance(10_000);
  WS.last.serverClose(CloseCode.REPLICA_STOPPING);
  assert.equal(client.stateInfo.delay, 499);
  clock.advance(499);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub"), [{ type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" }, cursor: "c1" }]);

  // a connection that drops sooner does not
  WS.last.serverClose(1006);
  assert.equal(client.stateInfo.delay, 999);
});

test("close 1008 stops: state stopped, no timer, no new socket", () => {
  const { WS, client, clock, states } = setup();
  const errors = [];
  client.onError((e) => errors.push(e));
  recordingSub(client);
  WS.last.serverOpen();
  WS.last.serverSend({ type: "error", code: "unauthorized", message: "no valid credential" });
  WS.last.serverClose(CloseCode.NOT_SERVED, "unauthorized");
  assert.deepEqual(errors, [{ code: "unauthorized", message: "no valid credential" }]);
  assert.equal(client.state, "stopped");
  assert.deepEqual(states, ["connecting", "live", "stopped"]);
  assert.equal(client.stateInfo.code, 1008);
  assert.deepEqual(client.stateInfo.error, { code: "unauthorized", message: "no valid credential" });
  assert.deepEqual(clock.pending, []);
  clock.advance(10 * 60_000);
  assert.equal(WS.instances.length, 1);

  // reconnect() is the way back (e.g. after signing in again)
  client.reconnect();
  assert.equal(WS.instances.length, 2);
  WS.last.serverOpen();
  assert.equal(client.state, "live");
  assert.equal(WS.last.frames("sub").length, 1);
});

test("1008 before the socket ever opened also stops", () => {
  const { WS, client, clock } = setup();
  WS.last.serverClose(CloseCode.NOT_SERVED);
  assert.equal(client.state, "stopped");
  clock.advance(60_000);
  assert.equal(WS.instances.length, 1);
});

test("close 1013 backs off more: at least 5 s, starting at a higher attempt", () => {
  for (const [r, expected] of [
    [0, 5_000], // the floor
    [0.5, 10_500], // attempt 5: [5 s, 16 s)
    [0.999, 15_989],
  ]) {
    const { WS, client, clock } = setup({ random: () => r });
    const errors = [];
    client.onError((e) => errors.push(e));
    recordingSub(client, { cursor: "c1" });
    WS.last.serverOpen();
    WS.last.serverSend({ type: "error", code: "rate_limited", message: "slow down" });
    WS.last.serverClose(CloseCode.TRY_AGAIN_LATER);
    assert.equal(client.state, "reconnecting");
    assert.equal(client.stateInfo.delay, expected, `random ${r}`);
    assert.deepEqual(client.stateInfo.error, { code: "rate_limited", message: "slow down" });
    assert.deepEqual(errors.map((e) => e.code), ["rate_limited"]);
    clock.advance(expected - 1);
    assert.equal(WS.instances.length, 1, "not before the delay");
    clock.advance(1);
    assert.equal(WS.instances.length, 2);
    WS.last.serverOpen();
    assert.equal(WS.last.frames("sub")[0].cursor, "c1", "resumes from the cursor");
    // a second 1013 in a row backs off further (attempt 6 reaches the cap)
    WS.last.serverClose(CloseCode.TRY_AGAIN_LATER);
    assert.ok(client.stateInfo.delay >= 5_000 && client.stateInfo.delay <= 30_000);
    if (r === 0.999) assert.equal(client.stateInfo.delay, 29_975);
  }
});

test("1013 compared with 1006 at the same attempt: the delay is larger", () => {
  const a = setup({ random: () => 0.3 });
  a.WS.last.serverOpen();
  a.WS.last.serverClose(1006);
  const b = setup({ random: () => 0.3 });
  b.WS.last.serverOpen();
  b.WS.last.serverClose(CloseCode.TRY_AGAIN_LATER);
  assert.equal(a.client.stateInfo.delay, 150);
  assert.equal(b.client.stateInfo.delay, 8_300);
});

test("validate failure is a resync with reason invalid; the subscription stays live", () => {
  const { WS, client } = setup();
  const { sub, calls } = recordingSub(client, {
    validate: (data) => {
      if (data === "boom") throw new Error("bad shape");
      return typeof data?.qty === "number";
    },
  });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "update", ids: [sub.id], key: "K", cursor: "c2", data: { qty: "three" } });
  assert.deepEqual(calls.updates, []);
  assert.deepEqual(calls.resyncs, [{ reason: "invalid", cursor: "c2" }]);
  assert.equal(sub.cursor, "c2");

  WS.last.serverSend({ type: "update", ids: [sub.id], key: "K", cursor: "c3", data: "boom" });
  assert.equal(calls.resyncs.length, 2);
  assert.equal(calls.resyncs[1].reason, "invalid");
  assert.equal(calls.resyncs[1].cursor, "c3");
  assert.equal(calls.resyncs[1].error.message, "bad shape");

  WS.last.serverSend({ type: "update", ids: [sub.id], key: "K", cursor: "c4", data: { qty: 3 } });
  assert.deepEqual(calls.updates, [{ data: { qty: 3 }, key: "K", cursor: "c4" }]);
  assert.equal(sub.active, true);
});

test("revoked ends the subscription: callback, inactive, not resubscribed, no unsub", () => {
  const { WS, client, clock } = setup();
  const gone = recordingSub(client);
  const kept = recordingSub(client, { scope: { warehouse: "south" } });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: gone.sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "subscribed", id: kept.sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "revoked", id: gone.sub.id, reason: "access_denied" });
  assert.deepEqual(gone.calls.revoked, [{ reason: "access_denied" }]);
  assert.equal(gone.sub.active, false);
  assert.deepEqual(client.subscriptions.map((s) => s.id), [kept.sub.id]);

  WS.last.serverSend({ type: "update", ids: [gone.sub.id, kept.sub.id], key: "K", cursor: "c2", data: {} });
  assert.equal(gone.calls.updates.length, 0, "nothing after revoked");
  assert.equal(kept.calls.updates.length, 1);
  gone.sub.unsubscribe();
  assert.deepEqual(WS.last.frames("unsub"), [], "the server already ended it");

  WS.last.serverClose(1012);
  clock.advance(30_000);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub").map((f) => f.id), [kept.sub.id]);
});

test("errors with an id: not_found, invalid_scope, unknown_channel end the subscription; others do not", () => {
  const { WS, client, clock } = setup();
  const subs = Object.fromEntries(
    ["not_found", "invalid_scope", "unknown_channel", "too_many_subscriptions", "internal"].map((code) => [code, recordingSub(client)]),
  );
  WS.last.serverOpen();
  for (const [code, { sub }] of Object.entries(subs)) {
    WS.last.serverSend({ type: "error", id: sub.id, code, message: `refused: ${code}` });
  }
  for (const [code, { sub, calls }] of Object.entries(subs)) {
    const ended = code !== "internal";
    assert.deepEqual(calls.errors, [{ code, message: `refused: ${code}`, ended }]);
    assert.equal(sub.active, !ended, code);
  }
  WS.last.serverClose(1006);
  clock.advance(30_000);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub").map((f) => f.id), [subs.internal.sub.id]);
});

test("unsubscribe sends unsub, is idempotent, and the sub is not resent after a reconnect", () => {
  const { WS, client, clock } = setup();
  const a = recordingSub(client);
  const b = recordingSub(client, { scope: { warehouse: "south" } });
  WS.last.serverOpen();
  a.sub.unsubscribe();
  a.sub.unsubscribe();
  assert.deepEqual(WS.last.frames("unsub"), [{ type: "unsub", id: a.sub.id }]);
  assert.equal(a.sub.active, false);
  WS.last.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "c1", data: {} });
  assert.equal(a.calls.updates.length, 0);

  WS.last.serverClose(1006);
  b.sub.unsubscribe(); // while disconnected: nothing to send
  clock.advance(30_000);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.sent, []);
});

test("unsubscribe before the socket opened sends nothing", () => {
  const { WS, client } = setup();
  const { sub } = recordingSub(client);
  sub.unsubscribe();
  WS.last.serverOpen();
  assert.deepEqual(WS.last.sent, []);
});

test("close() stops for good: socket closed with 1000, no reconnect, no callbacks", () => {
  const { WS, client, clock, states } = setup();
  const { sub, calls } = recordingSub(client);
  WS.last.serverOpen();
  const socket = WS.last;
  client.close();
  assert.deepEqual(socket.closedWith, { code: 1000, reason: undefined });
  assert.deepEqual(states, ["connecting", "live", "stopped"]);
  assert.equal(sub.active, false);
  socket.serverSend({ type: "update", ids: [sub.id], key: "K", cursor: "c1", data: {} });
  socket.serverClose(1006);
  clock.advance(60_000);
  assert.equal(WS.instances.length, 1);
  assert.equal(calls.updates.length, 0);
  assert.throws(() => client.subscribe({ channel: "warehouse" }), /after close/);
  client.close(); // idempotent
});

test("a socket that never opens is abandoned after connectTimeout and retried", () => {
  const { WS, client, clock } = setup({ connectTimeout: 15_000 });
  clock.advance(14_999);
  assert.equal(client.state, "connecting");
  clock.advance(1);
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1006);
  assert.deepEqual(WS.instances[0].closedWith?.code, 1000);
  clock.advance(client.stateInfo.delay);
  assert.equal(WS.instances.length, 2);
  WS.last.serverOpen();
  assert.equal(client.state, "live");
  clock.advance(60_000);
  assert.equal(WS.instances.length, 2, "an open socket is not timed out");
});

test("a throwing callback is reported and does not stop delivery to the others", () => {
  const { WS, client, reported } = setup();
  const bad = client.subscribe({ channel: "warehouse", scope: {}, onUpdate: () => { throw new Error("app bug"); } });
  const good = recordingSub(client);
  WS.last.serverOpen();
  WS.last.serverSend({ type: "update", ids: [bad.id, good.sub.id], key: "K", cursor: "c1", data: 1 });
  assert.equal(good.calls.updates.length, 1);
  assert.equal(reported.length, 1);
  assert.equal(reported[0].message, "app bug");
  assert.equal(bad.cursor, "c1");
});

test("malformed and unknown frames are ignored", () => {
  const { WS, client } = setup();
  const { sub, calls } = recordingSub(client);
  WS.last.serverOpen();
  WS.last.serverSend("not json");
  WS.last.serverSend("[1,2]");
  WS.last.serverSend({ type: "future_frame", id: sub.id });
  WS.last.serverSend({ type: "update", key: "K", cursor: "c1", data: {} }); // no ids
  WS.last.onmessage({ data: new TextEncoder().encode(JSON.stringify({ type: "subscribed", id: sub.id, cursor: "b1" })) });
  assert.equal(client.state, "live");
  assert.equal(calls.updates.length, 0);
  assert.deepEqual(calls.subscribed, [{ cursor: "b1", resumed: false }]);
});

test("subscribe checks its arguments and refuses a frame the server would close with 1009", () => {
  const { client } = setup();
  assert.throws(() => client.subscribe({}), /channel/);
  assert.throws(() => client.subscribe({ channel: "w", scope: [] }), /scope/);
  assert.throws(() => client.subscribe({ channel: "w", cursor: 5 }), /cursor/);
  assert.throws(() => client.subscribe({ channel: "w", onUpdate: "x" }), /onUpdate/);
  assert.throws(
    () => client.subscribe({ channel: "w", scope: { big: "x".repeat(MAX_FRAME_BYTES) } }),
    RangeError,
  );
  assert.equal(client.subscriptions.length, 0);
});

test("onState reports the current state at once; listeners can be removed", () => {
  const { WS, client } = setup();
  const seen = [];
  const off = client.onState((s) => seen.push(s));
  assert.deepEqual(seen, ["connecting"]);
  WS.last.serverOpen();
  off();
  WS.last.serverClose(1006);
  assert.deepEqual(seen, ["connecting", "live"]);
});

test("without a WebSocket implementation the constructor says how to provide one", { skip: typeof globalThis.WebSocket === "function" }, () => {
  assert.throws(() => new LiveClient({ url: "ws://x/api/a/live" }), /WebSocket/);
});

test("relative urls and app ids resolve against the page location", () => {
  const saved = Object.getOwnPropertyDescriptor(globalThis, "location");
  Object.defineProperty(globalThis, "location", { value: { href: "https://shop.example/inventory/page" }, configurable: true });
  try {
    const WS = fakeWebSocketClass();
    const clock = new FakeClock();
    const timers = { setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout };
    new LiveClient({ app: "inventory", WebSocket: WS, ...timers });
    new LiveClient({ url: "/api/inventory/live", WebSocket: WS, ...timers });
    new LiveClient({ url: () => "wss://other.example/api/inventory/live", WebSocket: WS, ...timers });
    assert.deepEqual(WS.instances.map((w) => w.url), [
      "wss://shop.example/api/inventory/live",
      "wss://shop.example/api/inventory/live",
      "wss://other.example/api/inventory/live",
    ]);
  } finally {
    if (saved) Object.defineProperty(globalThis, "location", saved);
    else delete globalThis.location;
  }
});
