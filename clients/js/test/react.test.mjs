// useLive in a real React tree (react-dom on jsdom) against the client's protocol fake: the test
// plays the server with the fake WebSocket and reads what the component rendered.
import "./dom.mjs";
import { test } from "node:test";
import assert from "node:assert/strict";
import { act, createElement, StrictMode, useState } from "react";
import { createRoot } from "react-dom/client";
import { CloseCode } from "../outlive.js";
import { useLive } from "../react.js";
import { setup } from "./fakes.mjs";

/** A component that renders the hook's result as data attributes, and keeps the last one. */
function mount(client, options, { strict = false } = {}) {
  const seen = { results: [], updates: [], loads: [] };
  let setOptions;
  function Probe({ client: c }) {
    const [opts, set] = useState(options);
    setOptions = set;
    const live = useLive(c, opts);
    seen.last = live;
    seen.results.push(live.status);
    return createElement("output", {
      "data-status": live.status,
      "data-cursor": live.cursor ?? "",
      "data-error": live.error?.code ?? "",
    }, live.lastUpdate ? `${live.lastUpdate.key}:${JSON.stringify(live.lastUpdate.data)}` : "");
  }
  const container = document.createElement("div");
  document.body.append(container);
  const root = createRoot(container);
  const render = (c) => act(() => root.render(strict ? createElement(StrictMode, null, createElement(Probe, { client: c })) : createElement(Probe, { client: c })));
  render(client);
  const out = () => container.querySelector("output");
  return {
    seen,
    status: () => out()?.dataset.status,
    cursor: () => out()?.dataset.cursor,
    error: () => out()?.dataset.error,
    text: () => out()?.textContent,
    rerender: render,
    setOptions: (o) => act(() => setOptions(o)),
    unmount: () => act(() => root.unmount()),
  };
}

/** a promise the test settles by hand, for `load` */
function deferred() {
  let resolve, reject;
  const promise = new Promise((a, b) => ((resolve = a), (reject = b)));
  return { promise, resolve, reject };
}

const server = (ws) => ({ send: (frame) => act(() => ws.serverSend(frame)), close: (code, reason) => act(() => ws.serverClose(code, reason)) });

test("mount subscribes with scope and filter; subscribed without a cursor loads, then live", async () => {
  const { WS, client } = setup();
  const loads = [];
  let pending = deferred();
  const view = mount(client, {
    channel: "warehouse",
    scope: { warehouse: "north" },
    filter: { type: "item.deleted" },
    load: (info) => (loads.push(info), pending.promise),
  });
  assert.equal(view.status(), "connecting");
  act(() => WS.last.serverOpen());
  const [sub] = WS.last.frames("sub");
  assert.deepEqual(sub, { type: "sub", id: sub.id, channel: "warehouse", scope: { warehouse: "north" }, filter: { type: "item.deleted" } });
  assert.equal(view.status(), "connecting", "an open socket is not a confirmed sub");

  server(WS.last).send({ type: "subscribed", id: sub.id, cursor: "c1" });
  assert.equal(view.status(), "resyncing");
  assert.equal(view.cursor(), "c1");
  assert.equal(loads.length, 1);
  assert.equal(loads[0].reason, "initial");
  assert.equal(loads[0].cursor, "c1");
  await act(async () => pending.resolve());
  assert.equal(view.status(), "live");
  view.unmount();
});

test("updates render the last one and its cursor; onUpdate sees every one", () => {
  const { WS, client } = setup();
  const updates = [];
  const view = mount(client, { channel: "warehouse", scope: { warehouse: "north" }, cursor: "ssr", onUpdate: (d) => updates.push(d) });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  assert.equal(WS.last.frames("sub")[0].cursor, "ssr", "options.cursor resumes the first subscription");
  const s = server(WS.last);
  s.send({ type: "subscribed", id, cursor: "ssr" });
  assert.equal(view.status(), "live", "a resumed sub needs no load");
  act(() => {
    WS.last.serverSend({ type: "update", ids: [id], key: "item:1", cursor: "c2", data: { n: 1 } });
    WS.last.serverSend({ type: "update", ids: [id], key: "item:2", cursor: "c3", data: { n: 2 } });
  });
  assert.deepEqual(updates, [{ n: 1 }, { n: 2 }]);
  assert.equal(view.text(), 'item:2:{"n":2}');
  assert.equal(view.cursor(), "c3");
  assert.equal(view.status(), "live");
  view.unmount();
});

test("resync: resyncing while load runs (the older load aborted), live when the newest settles", async () => {
  const { WS, client } = setup();
  const loads = [];
  const view = mount(client, { channel: "warehouse", cursor: "c0", load: (info) => { const d = deferred(); loads.push({ info, d }); return d.promise; } });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  const s = server(WS.last);
  s.send({ type: "subscribed", id, cursor: "c0" });
  s.send({ type: "resync", id, cursor: "c5", reason: "window" });
  assert.equal(view.status(), "resyncing");
  assert.equal(view.seen.last.resync.reason, "window");
  s.send({ type: "resync", id, cursor: "c6", reason: "access" });
  assert.deepEqual(loads.map((l) => [l.info.reason, l.info.cursor, l.info.signal.aborted]), [["window", "c5", true], ["access", "c6", false]]);
  await act(async () => loads[0].d.resolve());
  assert.equal(view.status(), "resyncing", "the aborted load does not end resyncing");
  await act(async () => loads[1].d.resolve());
  assert.equal(view.status(), "live");
  assert.equal(view.cursor(), "c6");
  // a load that fails is an error the component can show
  s.send({ type: "resync", id, cursor: "c7", reason: "keys_changed" });
  await act(async () => loads[2].d.reject(new Error("503")));
  assert.equal(view.status(), "error");
  assert.equal(view.error(), "load_failed");
  view.unmount();
});

test("resync without load stays resyncing until resynced()", () => {
  const { WS, client } = setup();
  const view = mount(client, { channel: "warehouse" });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id, cursor: "c1" });
  assert.equal(view.status(), "live", "without load there is nothing to wait for");
  server(WS.last).send({ type: "resync", id, cursor: "c2", reason: "topic" });
  assert.equal(view.status(), "resyncing");
  act(() => view.seen.last.resynced());
  assert.equal(view.status(), "live");
  view.unmount();
});

test("a dropped socket: connecting, then the sub resumes from the last cursor without a load", () => {
  const { WS, client, clock } = setup();
  let loads = 0;
  const view = mount(client, { channel: "warehouse", cursor: "c0", load: () => void loads++ });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id, cursor: "c0" });
  server(WS.last).send({ type: "update", ids: [id], key: "k", cursor: "c4", data: {} });
  act(() => WS.last.serverSend({ type: "progress", cursor: "c9" }));
  server(WS.last).close(1012, "stopping");
  assert.equal(view.status(), "connecting");
  act(() => clock.advance(60_000));
  act(() => WS.last.serverOpen());
  assert.deepEqual(WS.last.frames("sub").map((f) => [f.id, f.cursor]), [[id, "c9"]]);
  server(WS.last).send({ type: "subscribed", id, cursor: "c9" });
  assert.equal(view.status(), "live");
  assert.equal(loads, 0);
  view.unmount();
});

test("a client with token(): the hook's sub follows the auth frame; 4401 resumes with a fresh token and no load", async () => {
  let n = 0;
  const { WS, client } = setup({ token: async () => `jwt-${++n}` });
  let loads = 0;
  const view = mount(client, { channel: "warehouse", cursor: "c0", load: () => void loads++ });
  await act(async () => WS.last.serverOpen());
  assert.deepEqual(WS.last.sent.map((f) => f.type), ["auth", "sub"]);
  assert.equal(WS.last.sent[0].token, "jwt-1");
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id, cursor: "c0" });
  server(WS.last).send({ type: "update", ids: [id], key: "k", cursor: "c3", data: { qty: 1 } });
  assert.equal(view.status(), "live");
  server(WS.last).send({ type: "auth_expiring", in_ms: 30_000 });
  await act(async () => {});
  assert.deepEqual(WS.last.frames("auth").map((f) => f.token), ["jwt-1", "jwt-2"]);
  assert.equal(view.status(), "live", "a refresh does not disturb the subscription");

  server(WS.last).send({ type: "error", code: "token_expired", message: "expired" });
  server(WS.last).close(CloseCode.TOKEN_EXPIRED, "token expired");
  assert.equal(view.status(), "connecting", "not an error: the client reconnects");
  assert.equal(WS.instances.length, 2);
  await act(async () => WS.last.serverOpen());
  assert.deepEqual(WS.last.sent, [
    { type: "auth", token: "jwt-3" },
    { type: "sub", id, channel: "warehouse", scope: {}, cursor: "c3" },
  ]);
  server(WS.last).send({ type: "subscribed", id, cursor: "c3" });
  assert.equal(view.status(), "live");
  assert.equal(loads, 0);
  view.unmount();
});

test("revoked ends the subscription: status revoked, no unsub on unmount", () => {
  const { WS, client } = setup();
  const view = mount(client, { channel: "item", scope: { item: "i1" } });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id, cursor: "c1" });
  server(WS.last).send({ type: "revoked", id, reason: "access_denied" });
  assert.equal(view.status(), "revoked");
  assert.equal(client.subscriptions.length, 0);
  view.unmount();
  assert.equal(WS.last.frames("unsub").length, 0);
});

test("an ending error and a stopped client (1008) are status error with the code", () => {
  const { WS, client } = setup();
  const view = mount(client, { channel: "warehouse", scope: { warehouse: "nowhere" } });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "error", id, code: "not_found", message: "no such warehouse" });
  assert.equal(view.status(), "error");
  assert.equal(view.error(), "not_found");
  view.unmount();

  const b = setup();
  const other = mount(b.client, { channel: "warehouse" });
  act(() => b.WS.last.serverOpen());
  server(b.WS.last).send({ type: "error", code: "unauthorized", message: "signed out" });
  server(b.WS.last).close(CloseCode.NOT_SERVED, "unauthorized");
  assert.equal(other.status(), "error");
  assert.equal(other.error(), "unauthorized");
  other.unmount();
});

test("an invalid filter is status error, not a crash of the tree", () => {
  const { client } = setup();
  const view = mount(client, { channel: "warehouse", filter: { where: { nested: 1 } } });
  assert.equal(view.status(), "error");
  assert.equal(view.error(), "invalid_subscription");
  assert.equal(client.subscriptions.length, 0);
  view.unmount();
});

test("unmount unsubscribes; frames that arrive afterwards change nothing", () => {
  const { WS, client } = setup();
  const view = mount(client, { channel: "warehouse" });
  act(() => WS.last.serverOpen());
  const id = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id, cursor: "c1" });
  const renders = view.seen.results.length;
  view.unmount();
  assert.deepEqual(WS.last.frames("unsub"), [{ type: "unsub", id }]);
  assert.equal(client.subscriptions.length, 0);
  server(WS.last).send({ type: "update", ids: [id], key: "k", cursor: "c2", data: {} });
  assert.equal(view.seen.results.length, renders);
});

test("a new scope subscribes anew without a cursor; a new client resumes from the last cursor", async () => {
  const { WS, client } = setup();
  let loads = 0;
  const view = mount(client, { channel: "warehouse", scope: { warehouse: "north" }, cursor: "c0", load: () => void loads++ });
  act(() => WS.last.serverOpen());
  const first = WS.last.frames("sub")[0].id;
  server(WS.last).send({ type: "subscribed", id: first, cursor: "c0" });
  server(WS.last).send({ type: "update", ids: [first], key: "k", cursor: "c3", data: { n: 3 } });

  view.setOptions({ channel: "warehouse", scope: { warehouse: "south" }, cursor: "c0", load: () => void loads++ });
  const subs = WS.last.frames("sub");
  assert.deepEqual(WS.last.frames("unsub"), [{ type: "unsub", id: first }]);
  assert.equal(subs.length, 2);
  assert.deepEqual(subs[1].scope, { warehouse: "south" });
  assert.equal("cursor" in subs[1], false, "another data set: load it, no replay from the old cursor");
  assert.equal(view.text(), "", "the last update of the old scope is gone");
  server(WS.last).send({ type: "subscribed", id: subs[1].id, cursor: "c4" });
  assert.equal(loads, 1);
  assert.equal(view.status(), "resyncing");
  await act(async () => {}); // the load returned at once; its settling is a microtask
  assert.equal(view.status(), "live");

  // the same subscription on another client resumes from where it was
  const b = setup();
  view.rerender(b.client);
  act(() => b.WS.last.serverOpen());
  assert.deepEqual(b.WS.last.frames("sub").map((f) => [f.scope, f.cursor]), [[{ warehouse: "south" }, "c4"]]);
  server(b.WS.last).send({ type: "subscribed", id: b.WS.last.frames("sub")[0].id, cursor: "c4" });
  assert.equal(view.status(), "live");
  assert.equal(loads, 1);
  view.unmount();
});

test("StrictMode's double mount leaves one subscription, and callbacks changing do not resubscribe", () => {
  const { WS, client } = setup();
  act(() => WS.last.serverOpen());
  const view = mount(client, { channel: "warehouse", cursor: "c0" }, { strict: true });
  assert.equal(client.subscriptions.length, 1);
  const live = client.subscriptions[0];
  assert.equal(live.cursor, "c0");
  server(WS.last).send({ type: "subscribed", id: live.id, cursor: "c0" });
  assert.equal(view.status(), "live");
  view.setOptions({ channel: "warehouse", cursor: "c0", onUpdate: () => {} });
  assert.equal(client.subscriptions.length, 1);
  assert.equal(client.subscriptions[0].id, live.id);
  view.unmount();
  assert.equal(client.subscriptions.length, 0);
});
