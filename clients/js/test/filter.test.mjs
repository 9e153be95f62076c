// Subscription filters (SPEC 5.2 rev 3) on the client's side: checked before anything is sent,
// carried in every sub frame (reconnects included), never applied to resync or revoked by the client.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkFilter, MAX_FILTER_FIELDS, MAX_FRAME_BYTES } from "../outlive.js";
import { setup, recordingSub } from "./fakes.mjs";

test("the filter is sent in the sub frame and again with the cursor after a reconnect", () => {
  const { WS, client, clock } = setup();
  const { sub } = recordingSub(client, { filter: { type: "item.deleted", qty: 0, hot: true, note: null } });
  assert.deepEqual(sub.filter, { type: "item.deleted", qty: 0, hot: true, note: null });
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub"), [
    { type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" }, filter: { type: "item.deleted", qty: 0, hot: true, note: null } },
  ]);
  WS.last.serverSend({ type: "subscribed", id: sub.id, cursor: "c1" });
  WS.last.serverClose(1006);
  clock.advance(60_000);
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub"), [
    { type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" }, filter: { type: "item.deleted", qty: 0, hot: true, note: null }, cursor: "c1" },
  ]);
});

test("the client keeps its own copy: changing the object passed later changes nothing", () => {
  const { WS, client } = setup();
  const filter = { type: "item.deleted" };
  const { sub } = recordingSub(client, { filter });
  filter.type = "item.updated";
  filter.extra = 1;
  WS.last.serverOpen();
  assert.deepEqual(WS.last.frames("sub")[0].filter, { type: "item.deleted" });
  assert.deepEqual(sub.filter, { type: "item.deleted" });
});

test("no filter, null and {} send no filter field (every update matches)", () => {
  const { WS, client } = setup();
  const a = client.subscribe({ channel: "w" });
  const b = client.subscribe({ channel: "w", filter: null });
  const c = client.subscribe({ channel: "w", filter: {} });
  WS.last.serverOpen();
  for (const frame of WS.last.frames("sub")) assert.equal("filter" in frame, false);
  for (const s of [a, b, c]) assert.equal(s.filter, null);
});

test("exactly 8 fields are accepted; 9 are refused with an error that says the limit", () => {
  assert.equal(MAX_FILTER_FIELDS, 8);
  const eight = Object.fromEntries(Array.from({ length: 8 }, (_, i) => [`f${i}`, i]));
  assert.deepEqual(checkFilter(eight), eight);
  const { WS, client } = setup();
  client.subscribe({ channel: "w", filter: eight });
  assert.throws(
    () => client.subscribe({ channel: "w", filter: { ...eight, f8: 8 } }),
    (e) => e instanceof RangeError && /9 fields; at most 8/.test(e.message),
  );
  WS.last.serverOpen();
  assert.equal(WS.last.frames("sub").length, 1, "the refused subscription is never sent");
  assert.equal(client.subscriptions.length, 1);
});

test("values that are not JSON scalars are refused, naming the field", () => {
  const cases = [
    [{ where: { nested: 1 } }, /"where" is an object/],
    [{ tags: ["a"] }, /"tags" is an array/],
    [{ n: NaN }, /"n" is NaN/],
    [{ n: Infinity }, /"n" is Infinity/],
    [{ u: undefined }, /"u" is undefined/],
    [{ big: 1n }, /"big" is a bigint/],
    [{ f: () => 1 }, /"f" is a function/],
    [{ d: new Date(0) }, /"d" is an object/],
  ];
  for (const [filter, message] of cases) {
    assert.throws(() => checkFilter(filter), (e) => e instanceof TypeError && message.test(e.message), JSON.stringify(Object.keys(filter)));
  }
  for (const filter of ["type=deleted", 3, ["a"], new Map([["a", 1]]), new Date(0)]) {
    assert.throws(() => checkFilter(filter), /filter must be a plain object/);
  }
  // what a subscribe shows the caller
  const { client } = setup();
  assert.throws(() => client.subscribe({ channel: "w", filter: { where: { nested: 1 } } }), /filter field "where"/);
  assert.equal(client.subscriptions.length, 0);
  // a prototype-less object is a plain object too
  const bare = Object.create(null);
  bare.type = "x";
  assert.deepEqual(checkFilter(bare), { type: "x" });
});

test("the filter counts towards the 16 KiB sub frame", () => {
  const { client } = setup();
  assert.throws(() => client.subscribe({ channel: "w", filter: { big: "x".repeat(MAX_FRAME_BYTES) } }), RangeError);
  assert.equal(client.subscriptions.length, 0);
});

test("resync and revoked reach a filtered subscription; an invalid_message error ends it", () => {
  const { WS, client } = setup();
  const a = recordingSub(client, { filter: { type: "item.deleted" } });
  const b = recordingSub(client, { filter: { type: "item.deleted" } });
  WS.last.serverOpen();
  WS.last.serverSend({ type: "subscribed", id: a.sub.id, cursor: "c1" });
  WS.last.serverSend({ type: "resync", id: a.sub.id, cursor: "c2", reason: "access" });
  WS.last.serverSend({ type: "revoked", id: a.sub.id, reason: "access_denied" });
  assert.deepEqual(a.calls.resyncs, [{ reason: "access", cursor: "c2" }]);
  assert.deepEqual(a.calls.revoked, [{ reason: "access_denied" }]);
  // a server with a stricter rule than the client's check answers invalid_message; the socket stays
  WS.last.serverSend({ type: "error", id: b.sub.id, code: "invalid_message", message: "invalid filter" });
  assert.deepEqual(b.calls.errors, [{ code: "invalid_message", message: "invalid filter", ended: true }]);
  assert.equal(b.sub.active, false);
  assert.equal(client.state, "live");
});
