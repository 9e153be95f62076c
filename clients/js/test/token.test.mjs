// The token option (SPEC 5.1 rev 4, 5.3 auth_expiring and token_expired, 5.7 close 4401): the
// JWT goes as the socket's first message, is asked for again on auth_expiring, on 4401 and before
// every reconnect. Fake WebSocket and fake clock: nothing sleeps; `settled()` only lets the
// promise callbacks already queued run (a macrotask turn), it waits for no time.
import { test } from "node:test";
import assert from "node:assert/strict";
import { CloseCode } from "../outlive.js";
import { setup, recordingSub } from "./fakes.mjs";

const settled = () => new Promise((resolve) => setImmediate(resolve));

/** A token() whose answers the test settles by hand; `calls` counts the calls. */
function manualToken() {
  const pending = [];
  const fn = () =>
    new Promise((resolve, reject) => {
      pending.push({ resolve, reject });
    });
  return {
    fn,
    get calls() {
      return pending.length;
    },
    /** settles the oldest unsettled call */
    async give(token) {
      const p = pending.find((x) => !x.done);
      assert.ok(p, "token() was not called");
      p.done = true;
      p.resolve(token);
      await settled();
    },
    async fail(error) {
      const p = pending.find((x) => !x.done);
      assert.ok(p, "token() was not called");
      p.done = true;
      p.reject(error);
      await settled();
    },
  };
}

/** A token() that answers at once (a promise) with jwt-1, jwt-2, … */
function countingToken() {
  const t = { calls: 0 };
  t.fn = async () => `jwt-${++t.calls}`;
  return t;
}

test("the auth frame is the socket's first message, before every sub; subs wait for it", async () => {
  const token = manualToken();
  const { WS, client, states } = setup({ token: token.fn });
  const a = recordingSub(client, { cursor: "c1" });
  assert.equal(token.calls, 0, "token() is asked only once the socket is open");
  WS.last.serverOpen();
  assert.equal(token.calls, 1);
  // a sub made while token() is pending waits behind the auth frame too
  const b = recordingSub(client, { scope: { warehouse: "south" } });
  assert.deepEqual(WS.last.sent, [], "nothing before the token");
  assert.equal(client.state, "connecting", "not live before the auth frame");
  await token.give("jwt-A");
  assert.deepEqual(WS.last.sent, [
    { type: "auth", token: "jwt-A" },
    { type: "sub", id: a.sub.id, channel: "warehouse", scope: { warehouse: "north" }, cursor: "c1" },
    { type: "sub", id: b.sub.id, channel: "warehouse", scope: { warehouse: "south" } },
  ]);
  assert.deepEqual(states, ["connecting", "live"]);
  assert.ok(!WS.last.url.includes("jwt"), "the token is never in the URL");
  // live: a new sub goes at once, no new auth
  const c = recordingSub(client, { scope: { warehouse: "east" } });
  assert.deepEqual(WS.last.sent.at(-1).id, c.sub.id);
  assert.equal(WS.last.frames("auth").length, 1);
});

test("a token() that returns a string (no promise) is sent synchronously on open", () => {
  const { WS, client } = setup({ token: () => "plain" });
  const { sub } = recordingSub(client);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.sent.map((f) => f.type), ["auth", "sub"]);
  assert.equal(WS.last.sent[0].token, "plain");
  assert.equal(WS.last.sent[1].id, sub.id);
  assert.equal(client.state, "live");
});

test("auth_expiring: token() again and a new auth frame on the same socket, subscriptions kept", async () => {
  const token = countingToken();
  const { WS, client, states } = setup({ token: token.fn });
  const { sub, calls } = recordingSub(client);
  WS.last.serverOpen();
  await settled();
  const socket = WS.last;
  socket.serverSend({ type: "subscribed", id: sub.id, cursor: "c1" });
  assert.equal(token.calls, 1);

  socket.serverSend({ type: "auth_expiring", in_ms: 30_000 });
  await settled();
  assert.equal(token.calls, 2);
  assert.deepEqual(socket.sent, [
    { type: "auth", token: "jwt-1" },
    { type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" } },
    { type: "auth", token: "jwt-2" },
  ]);
  assert.equal(WS.instances.length, 1, "no new socket");
  assert.equal(socket.closedWith, null);
  assert.deepEqual(states, ["connecting", "live"]);
  socket.serverSend({ type: "update", ids: [sub.id], key: "K", cursor: "c2", data: { n: 1 } });
  assert.deepEqual(calls.updates, [{ data: { n: 1 }, key: "K", cursor: "c2" }]);

  // and again at the next expiry
  socket.serverSend({ type: "auth_expiring", in_ms: 30_000 });
  await settled();
  assert.deepEqual(socket.frames("auth").map((f) => f.token), ["jwt-1", "jwt-2", "jwt-3"]);
  assert.equal(socket.frames("sub").length, 1, "never resubscribed");
});

test("auth_expiring while a refresh is pending asks token() once; a failed refresh is reported, the socket stays", async () => {
  const token = manualToken();
  const { WS, client } = setup({ token: token.fn });
  const errors = [];
  client.onError((e) => errors.push(e));
  WS.last.serverOpen();
  await token.give("jwt-1");
  WS.last.serverSend({ type: "auth_expiring", in_ms: 30_000 });
  WS.last.serverSend({ type: "auth_expiring", in_ms: 30_000 });
  assert.equal(token.calls, 2);
  await token.fail(new Error("idp down"));
  assert.deepEqual(errors, [{ code: "token", message: "token() failed: idp down" }]);
  assert.equal(client.state, "live");
  assert.equal(WS.last.frames("auth").length, 1);
  // the next auth_expiring asks again
  WS.last.serverSend({ type: "auth_expiring", in_ms: 10_000 });
  assert.equal(token.calls, 3);
  await token.give("jwt-3");
  assert.deepEqual(WS.last.frames("auth").map((f) => f.token), ["jwt-1", "jwt-3"]);
});

test("4401 token_expired: reconnect at once with a fresh token, then every sub from its cursor", async () => {
  const token = countingToken();
  const { WS, client, clock, states } = setup({ token: token.fn });
  const errors = [];
  client.onError((e) => errors.push(e));
  const a = recordingSub(client);
  const b = recordingSub(client, { scope: { warehouse: "south" }, cursor: "b0" });
  WS.last.serverOpen();
  await settled();
  const first = WS.last;
  first.serverSend({ type: "subscribed", id: a.sub.id, cursor: "c1" });
  first.serverSend({ type: "update", ids: [a.sub.id], key: "K", cursor: "c2", data: {} });
  clock.advance(60_000); // a long-lived connection: the backoff is reset

  first.serverSend({ type: "error", code: "token_expired", message: "the token expired" });
  first.serverClose(CloseCode.TOKEN_EXPIRED, "token expired");
  assert.deepEqual(errors, [{ code: "token_expired", message: "the token expired" }]);
  assert.equal(client.state, "reconnecting", "not a stop");
  assert.equal(client.stateInfo.code, 4401);
  assert.equal(client.stateInfo.delay, 0);
  assert.equal(WS.instances.length, 2, "a new socket at once, no backoff timer");
  const second = WS.last;
  second.serverOpen();
  assert.equal(token.calls, 2, "a fresh token for the new socket");
  await settled();
  assert.deepEqual(second.sent, [
    { type: "auth", token: "jwt-2" },
    { type: "sub", id: a.sub.id, channel: "warehouse", scope: { warehouse: "north" }, cursor: "c2" },
    { type: "sub", id: b.sub.id, channel: "warehouse", scope: { warehouse: "south" }, cursor: "b0" },
  ]);
  assert.deepEqual(states, ["connecting", "live", "reconnecting", "live"]);
});

test("4401 again before the connection was stable takes the backoff (no tight loop)", async () => {
  const token = countingToken();
  const { WS, client, clock } = setup({ token: token.fn, random: () => 0.5 });
  WS.last.serverOpen();
  await settled();
  WS.last.serverClose(CloseCode.TOKEN_EXPIRED);
  assert.equal(WS.instances.length, 2);
  WS.last.serverOpen();
  await settled();
  WS.last.serverClose(CloseCode.TOKEN_EXPIRED);
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.delay, 250, "attempt 0 of the backoff");
  assert.equal(WS.instances.length, 2, "waits for the delay");
  clock.advance(250);
  assert.equal(WS.instances.length, 3);
  // once a connection stays open stableAfter, a 4401 is again reconnected at once
  WS.last.serverOpen();
  await settled();
  clock.advance(10_000);
  WS.last.serverClose(CloseCode.TOKEN_EXPIRED);
  assert.equal(client.stateInfo.delay, 0);
  assert.equal(WS.instances.length, 4);
});

test("token() is asked before every reconnect (1011, 1012, 1006): a new value each time, never a cached one", async () => {
  const token = countingToken();
  const { WS, client, clock } = setup({ token: token.fn });
  const { sub } = recordingSub(client, { cursor: "c1" });
  for (const code of [null, CloseCode.ACCESS_CHECK_FAILED, CloseCode.REPLICA_STOPPING, 1006]) {
    if (code !== null) {
      WS.last.serverClose(code);
      assert.equal(client.state, "reconnecting");
      clock.advance(client.stateInfo.delay);
    }
    WS.last.serverOpen();
    await settled();
  }
  assert.equal(token.calls, 4);
  assert.deepEqual(
    WS.instances.map((ws) => ws.sent[0]),
    [1, 2, 3, 4].map((n) => ({ type: "auth", token: `jwt-${n}` })),
  );
  for (const ws of WS.instances) {
    assert.deepEqual(ws.sent.map((f) => f.type), ["auth", "sub"]);
    assert.equal(ws.sent[1].id, sub.id);
    assert.ok(!ws.url.includes("jwt"));
  }
});

test("a rejecting token() is a failed open: reported, socket closed, retried with backoff", async () => {
  let fail = 2;
  let calls = 0;
  const token = async () => {
    calls++;
    if (fail-- > 0) throw new Error(`no session (${calls})`);
    return "jwt-ok";
  };
  const { WS, client, clock, states } = setup({ token, random: () => 0.5 });
  const errors = [];
  client.onError((e) => errors.push(e));
  const { sub } = recordingSub(client, { cursor: "c1" });
  WS.last.serverOpen();
  await settled();
  assert.deepEqual(errors, [{ code: "token", message: "token() failed: no session (1)" }]);
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.reason, "token() failed");
  assert.equal(client.stateInfo.error.message, "no session (1)");
  assert.equal(client.stateInfo.delay, 250);
  assert.deepEqual(WS.instances[0].sent, [], "no sub without the auth frame");
  assert.equal(WS.instances[0].closedWith.code, 1000, "the socket is closed");

  clock.advance(250);
  WS.last.serverOpen();
  await settled();
  assert.equal(client.stateInfo.delay, 500, "the backoff grows");
  assert.equal(errors.length, 2);

  clock.advance(500);
  WS.last.serverOpen();
  await settled();
  assert.equal(calls, 3);
  assert.equal(client.state, "live");
  assert.deepEqual(WS.last.sent, [
    { type: "auth", token: "jwt-ok" },
    { type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" }, cursor: "c1" },
  ]);
  assert.deepEqual(states, ["connecting", "reconnecting", "live"]);
});

test("a token() that throws synchronously, or gives no string, is a failed open too", async () => {
  for (const [token, message] of [
    [() => { throw new Error("sync boom"); }, "sync boom"],
    [async () => undefined, "token() gave undefined, not a token"],
    [() => "", "token() gave an empty string, not a token"],
    [() => "x".repeat(20_000), "the auth frame would exceed"],
  ]) {
    const { WS, client } = setup({ token });
    const errors = [];
    client.onError((e) => errors.push(e));
    WS.last.serverOpen();
    await settled();
    assert.equal(client.state, "reconnecting", message);
    assert.equal(errors.length, 1);
    assert.match(errors[0].message, new RegExp(message.replace(/[()]/g, "\\$&")));
    assert.deepEqual(WS.last.sent, []);
  }
});

test("a token() that never settles is abandoned after connectTimeout and retried", async () => {
  const token = manualToken();
  const { WS, client, clock } = setup({ token: token.fn, connectTimeout: 15_000 });
  WS.last.serverOpen();
  clock.advance(14_999);
  assert.equal(client.state, "connecting");
  clock.advance(1);
  assert.equal(client.state, "reconnecting");
  assert.equal(WS.instances[0].closedWith.code, 1000);
  await token.give("late"); // settles after the socket was given up: ignored
  assert.deepEqual(WS.instances[0].sent, []);
  clock.advance(client.stateInfo.delay);
  WS.last.serverOpen();
  assert.equal(token.calls, 2);
  await token.give("jwt-2");
  assert.deepEqual(WS.last.sent, [{ type: "auth", token: "jwt-2" }]);
  assert.equal(client.state, "live");
});

test("1008 still stops with a token; close() while token() is pending sends nothing", async () => {
  const token = countingToken();
  const a = setup({ token: token.fn });
  a.WS.last.serverOpen();
  await settled();
  a.WS.last.serverSend({ type: "error", code: "unauthorized", message: "bad token" });
  a.WS.last.serverClose(CloseCode.NOT_SERVED);
  assert.equal(a.client.state, "stopped");
  assert.deepEqual(a.clock.pending, []);

  const pending = manualToken();
  const b = setup({ token: pending.fn });
  b.WS.last.serverOpen();
  b.client.close();
  await pending.give("too-late");
  assert.deepEqual(b.WS.last.sent, []);
  assert.equal(b.client.state, "stopped");
});

test("without a token option: no auth frame, subs right on open (unchanged)", () => {
  const { WS, client } = setup();
  const { sub } = recordingSub(client);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.sent, [{ type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" } }]);
  WS.last.serverSend({ type: "auth_expiring", in_ms: 30_000 }); // ignored
  assert.deepEqual(WS.last.frames("auth"), []);
  assert.equal(client.state, "live");
});

test("the token option must be a function", () => {
  assert.throws(() => setup({ token: "jwt-in-a-string" }), /token must be a function/);
});
