// An invalid scope (SPEC 5.4): the server sends error invalid_scope with the sub's id and closes the
// whole socket with 1008. The client ends that subscription only and resumes the others; a 1008
// without such an error (credential, origin, app) still stops the client.
import { test } from "node:test";
import assert from "node:assert/strict";
import { CloseCode } from "../outlive.js";
import { setup, recordingSub } from "./fakes.mjs";

/** Two good subscriptions with cursors and a bad one, on an open socket. */
function threeSubs() {
  const t = setup();
  const good = recordingSub(t.client);
  const bad = recordingSub(t.client, { scope: { warehouse: 42 } });
  const other = recordingSub(t.client, { channel: "item", scope: { item: "i1" } });
  t.WS.last.serverOpen();
  t.WS.last.serverSend({ type: "subscribed", id: good.sub.id, cursor: "g1" });
  t.WS.last.serverSend({ type: "subscribed", id: other.sub.id, cursor: "o1" });
  return { ...t, good, bad, other };
}

test("invalid_scope then 1008: only that subscription ends, the others resume from their cursors", () => {
  const { WS, client, clock, states, good, bad, other } = threeSubs();
  WS.last.serverSend({ type: "error", id: bad.sub.id, code: "invalid_scope", message: "scope does not match the channel: /warehouse: not a string" });
  WS.last.serverClose(CloseCode.NOT_SERVED, "invalid scope");

  assert.deepEqual(bad.calls.errors, [{ code: "invalid_scope", message: "scope does not match the channel: /warehouse: not a string", ended: true }]);
  assert.equal(bad.sub.active, false);
  assert.equal(client.state, "reconnecting");
  assert.equal(client.stateInfo.code, 1008);
  assert.equal(client.stateInfo.invalidScope, bad.sub.id);
  assert.ok(client.stateInfo.delay < 500, "the usual backoff, not a stop");

  clock.advance(client.stateInfo.delay);
  assert.equal(WS.instances.length, 2);
  WS.last.serverOpen();
  assert.deepEqual(states, ["connecting", "live", "reconnecting", "live"]);
  assert.deepEqual(
    WS.last.frames("sub").map((f) => [f.id, f.cursor]),
    [[good.sub.id, "g1"], [other.sub.id, "o1"]],
    "the refused sub is not sent again",
  );
  assert.equal(good.calls.errors.length + other.calls.errors.length, 0);
  assert.deepEqual(client.subscriptions.map((s) => s.id), [good.sub.id, other.sub.id]);
});

test("a subscription unsubscribed before its invalid_scope arrived still lets the others resume", () => {
  const { WS, client, clock, bad } = threeSubs();
  bad.sub.unsubscribe();
  WS.last.serverSend({ type: "error", id: bad.sub.id, code: "invalid_scope", message: "bad" });
  WS.last.serverClose(CloseCode.NOT_SERVED, "invalid scope");
  assert.equal(bad.calls.errors.length, 0, "no callback after unsubscribe");
  assert.equal(client.state, "reconnecting");
  clock.advance(client.stateInfo.delay);
  assert.equal(WS.instances.length, 2);
});

test("1008 without an invalid_scope for one of our subs stops, whatever the close reason says", () => {
  // the reason text alone names no subscription: nothing says which one to drop
  for (const frames of [
    [],
    [{ type: "error", code: "unauthorized", message: "credential revoked" }],
    [{ type: "error", id: "not-ours", code: "invalid_scope", message: "x" }],
  ]) {
    const { WS, client, clock } = threeSubs();
    for (const f of frames) WS.last.serverSend(f);
    WS.last.serverClose(CloseCode.NOT_SERVED, "invalid scope");
    assert.equal(client.state, "stopped", JSON.stringify(frames));
    clock.advance(10 * 60_000);
    assert.equal(WS.instances.length, 1);
  }
});

test("a socket-level refusal after an invalid_scope still stops (the close is about the socket)", () => {
  const { WS, client, clock, bad } = threeSubs();
  WS.last.serverSend({ type: "error", id: bad.sub.id, code: "invalid_scope", message: "bad" });
  WS.last.serverSend({ type: "error", code: "unauthorized", message: "credential revoked" });
  WS.last.serverClose(CloseCode.NOT_SERVED, "unauthorized");
  assert.equal(client.state, "stopped");
  assert.deepEqual(client.stateInfo.error, { code: "unauthorized", message: "credential revoked" });
  clock.advance(10 * 60_000);
  assert.equal(WS.instances.length, 1);
});

test("an invalid_scope on an earlier socket does not excuse a later 1008", () => {
  const { WS, client, clock, bad } = threeSubs();
  WS.last.serverSend({ type: "error", id: bad.sub.id, code: "invalid_scope", message: "bad" });
  WS.last.serverClose(CloseCode.NOT_SERVED, "invalid scope");
  clock.advance(client.stateInfo.delay);
  WS.last.serverOpen();
  WS.last.serverClose(CloseCode.NOT_SERVED, "unauthorized");
  assert.equal(client.state, "stopped");
  clock.advance(10 * 60_000);
  assert.equal(WS.instances.length, 2);
});

test("a caller that keeps subscribing with an invalid scope is held back by the growing backoff", () => {
  const { WS, client, clock } = setup({ random: () => 0.999 });
  const delays = [];
  for (let i = 0; i < 6; i++) {
    const s = client.subscribe({ channel: "warehouse", scope: { warehouse: i } });
    WS.last.serverOpen();
    WS.last.serverSend({ type: "error", id: s.id, code: "invalid_scope", message: "bad" });
    WS.last.serverClose(CloseCode.NOT_SERVED, "invalid scope");
    delays.push(client.stateInfo.delay);
    clock.advance(client.stateInfo.delay);
  }
  assert.deepEqual(delays, [499, 999, 1998, 3996, 7992, 15984]);
});
