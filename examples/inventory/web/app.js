// The inventory demo page: sign in, load a warehouse's snapshot (the server reads the cursor
// first), subscribe from that cursor with clients/js/outlive.js, apply updates idempotently, reload
// on resync, and say so when access is revoked. Writes go over HTTP.
import { LiveClient } from "/outlive.js";

const $ = (selector) => document.querySelector(selector);

const page = {
  subject: null,
  socketAuth: "session", // "jwt" when the demo runs with --auth jwt (GET /api/me says so)
  warehouse: new URLSearchParams(location.search).get("warehouse") || "north",
  client: null,
  sub: null, // channel "warehouse"
  listSub: null, // channel "my_warehouses" (a collection)
  watch: null, // channel "warehouse" filtered to one item (the "watch" button)
  items: new Map(), // short id -> {id, name, quantity}
  counts: { updates: 0, resyncs: 0, loads: 0, reconnects: 0 },
  state: "idle", // the live client's state, as shown in #state
  loading: null, // the snapshot load in progress
  again: false, // something arrived while it loaded: load once more afterwards
  listLoading: null,
  listAgain: false,
};

// --- HTTP -----------------------------------------------------------------------------------

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body ?? {});
  }
  const res = await fetch(path, init);
  let data = null;
  try {
    data = await res.json();
  } catch {
    // not JSON
  }
  return { status: res.status, ok: res.ok, data };
}

// --- log and counters -------------------------------------------------------------------------

function log(text) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
  const list = $("#log");
  list.prepend(li);
  while (list.children.length > 100) list.lastChild.remove();
}

function count(name) {
  page.counts[name] += 1;
  $(`#${name}`).textContent = String(page.counts[name]);
}

function showCursor(cursor) {
  if (cursor) $("#cursor").textContent = cursor;
}

// --- rendering ----------------------------------------------------------------------------------

function renderState(state, info) {
  const el = $("#state");
  // A socket that was live and closed (e.g. 1012 when its replica stops): the client reconnects
  // and resumes from its cursors without reloading anything.
  if (state === "reconnecting" && page.state === "live") {
    count("reconnects");
    log(`socket closed (${info?.code ?? "?"}): reconnecting`);
  } else if (state === "live" && page.state === "reconnecting") {
    log("socket open again: the subscriptions resume from their cursors");
  }
  page.state = state;
  el.textContent = state;
  el.dataset.state = state;
  if (info?.code != null) el.dataset.closeCode = String(info.code); // the last close code
  let detail = "";
  if (state === "reconnecting" && info?.code != null) {
    detail = `closed ${info.code}${info.reason ? ` (${info.reason})` : ""}, retry in ${Math.round((info.delay ?? 0) / 100) / 10} s`;
  } else if (state === "stopped" && info?.code != null) {
    detail = `closed ${info.code}${info.error ? `: ${info.error.code}` : info.reason ? ` (${info.reason})` : ""}`;
  }
  $("#state-info").textContent = detail;
}

function renderItems() {
  const body = $("#items tbody");
  const rows = new Map([...body.querySelectorAll("tr[data-item]")].map((tr) => [tr.dataset.item, tr]));
  const ids = [...page.items.keys()].sort();
  for (const [id, tr] of rows) if (!page.items.has(id)) tr.remove();
  for (const id of ids) {
    const item = page.items.get(id);
    let tr = rows.get(id);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.item = id;
      tr.dataset.testid = `item-${id}`;
      tr.innerHTML =
        '<td class="id mono"></td><td class="name"></td><td class="quantity"></td>' +
        '<td><button type="button" class="plus">+1</button> <button type="button" class="watch">watch</button></td>';
      tr.querySelector(".id").textContent = id;
      const plus = tr.querySelector(".plus");
      plus.dataset.testid = `plus-${id}`;
      plus.addEventListener("click", () => increment(id));
      const watch = tr.querySelector(".watch");
      watch.dataset.testid = `watch-${id}`;
      watch.addEventListener("click", () => watchItem(id));
    }
    body.append(tr); // keeps the order
    tr.querySelector(".name").textContent = item.name;
    const q = tr.querySelector(".quantity");
    if (q.textContent !== String(item.quantity)) {
      q.textContent = String(item.quantity);
      flash(tr);
    }
  }
}

function flash(tr) {
  tr.classList.add("flash");
  setTimeout(() => tr.classList.remove("flash"), 50);
}

function showRevoked(message) {
  $("#revoked-message").textContent = message;
  $("#revoked").hidden = false;
  $("#items").classList.add("disabled");
  $("#leave").disabled = true;
}

function hideRevoked() {
  $("#revoked").hidden = true;
  $("#items").classList.remove("disabled");
  $("#leave").disabled = false;
}

function renderWarehouses(list, others) {
  const ul = $("#warehouses");
  ul.replaceChildren();
  for (const w of list) {
    const li = document.createElement("li");
    li.dataset.warehouse = w.publicId;
    const a = document.createElement("a");
    a.href = `?warehouse=${encodeURIComponent(w.publicId)}`;
    a.textContent = `${w.name || w.publicId} (${w.items})`;
    if (w.publicId === page.warehouse) a.classList.add("current");
    a.addEventListener("click", (event) => {
      event.preventDefault();
      history.pushState(null, "", a.href);
      openWarehouse(w.publicId);
    });
    li.append(a);
    ul.append(li);
  }
  const ol = $("#others");
  ol.replaceChildren();
  for (const w of others) {
    const li = document.createElement("li");
    li.dataset.warehouse = w.publicId;
    li.textContent = `${w.name || w.publicId} `;
    const join = document.createElement("button");
    join.type = "button";
    join.textContent = "join";
    join.dataset.testid = `join-${w.publicId}`;
    join.addEventListener("click", () => changeMember(w.publicId, "add"));
    li.append(join);
    ol.append(li);
  }
  $("#others-box").hidden = others.length === 0;
}

// --- snapshots ----------------------------------------------------------------------------------

// Loads the current warehouse again. Loads never overlap; something that arrives while one runs
// asks for one more, so a load that started before an update cannot leave its older value behind.
function reloadSnapshot() {
  if (page.loading) {
    page.again = true;
    return page.loading;
  }
  page.loading = (async () => {
    try {
      do {
        page.again = false;
        await loadSnapshot(page.warehouse);
      } while (page.again);
    } finally {
      page.loading = null;
    }
  })();
  return page.loading;
}

// GET /api/warehouses/<id>: {cursor, warehouse, items}. Returns the cursor, or null without access.
async function loadSnapshot(publicId) {
  const res = await api("GET", `/api/warehouses/${encodeURIComponent(publicId)}`);
  if (publicId !== page.warehouse) return null; // the user moved on
  count("loads");
  if (res.status === 401) {
    signedOut();
    return null;
  }
  if (res.status === 403 || res.status === 404) {
    page.items.clear();
    renderItems();
    showRevoked(res.status === 404 ? `there is no warehouse "${publicId}".` : "you are not a member of this warehouse.");
    return null;
  }
  if (!res.ok) {
    log(`snapshot failed: ${res.status} ${res.data?.message ?? ""}`);
    return null;
  }
  const { cursor, warehouse, items } = res.data;
  $("#warehouse-name").textContent = warehouse.name || warehouse.publicId;
  $("#warehouse-id").textContent = warehouse.publicId;
  page.items = new Map(items.map((it) => [it.id, it]));
  renderItems();
  return cursor;
}

function reloadWarehouses() {
  if (page.listLoading) {
    page.listAgain = true;
    return page.listLoading;
  }
  page.listLoading = (async () => {
    try {
      let cursor = null;
      do {
        page.listAgain = false;
        const res = await api("GET", "/api/warehouses");
        if (res.status === 401) return signedOut();
        if (!res.ok) return log(`warehouse list failed: ${res.status}`);
        renderWarehouses(res.data.warehouses, res.data.others ?? []);
        cursor = res.data.cursor;
      } while (page.listAgain);
      return cursor;
    } finally {
      page.listLoading = null;
    }
  })();
  return page.listLoading;
}

// --- live -----------------------------------------------------------------------------------------

const validItemUpdate = (data) =>
  data !== null && typeof data === "object" && typeof data.itemId === "string" &&
  (data.type === "item.changed" || data.type === "item.deleted");

function applyUpdate(data, meta) {
  count("updates");
  showCursor(meta.cursor);
  if (page.loading) page.again = true;
  if (data.type === "item.deleted") {
    page.items.delete(data.itemId);
    renderItems();
    log(`${data.itemId} deleted`);
    return;
  }
  const item = page.items.get(data.itemId);
  if (item && Number.isInteger(data.quantity)) {
    // Idempotent: the update carries the new value, so a repeated delivery changes nothing.
    item.quantity = data.quantity;
    renderItems();
    log(`${data.itemId}: quantity ${data.quantity}`);
  } else {
    // An update that only names the item (the rename trigger), or an item we do not know: load.
    log(`${data.itemId} changed: loading it again`);
    reloadSnapshot();
  }
}

async function openWarehouse(publicId) {
  page.warehouse = publicId;
  page.sub?.unsubscribe();
  page.sub = null;
  unwatch();
  hideRevoked();
  for (const a of document.querySelectorAll("#warehouses a")) {
    a.classList.toggle("current", a.parentElement.dataset.warehouse === publicId);
  }
  // The server read the cursor before the snapshot, so whatever changes from now on follows.
  const cursor = await loadSnapshot(publicId);
  if (cursor == null || publicId !== page.warehouse || !page.client) return;
  showCursor(cursor);
  let subscribedBefore = false;
  page.sub = page.client.subscribe({
    channel: "warehouse",
    scope: { warehouse: publicId },
    cursor,
    validate: validItemUpdate,
    onSubscribed({ cursor: c, resumed }) {
      showCursor(c);
      if (!resumed) log(`subscribed to ${publicId}`);
      else if (!subscribedBefore) log(`subscribed to ${publicId} from the snapshot's cursor`);
      else log(`resumed ${publicId} from its cursor: nothing to load`);
      subscribedBefore = true;
      if (!resumed) reloadSnapshot(); // no cursor was sent: load after subscribing
    },
    onUpdate: applyUpdate,
    onResync({ reason, cursor: c }) {
      count("resyncs");
      showCursor(c);
      log(`resync (${reason}): loading the snapshot again`);
      reloadSnapshot();
    },
    onRevoked({ reason }) {
      log(`revoked (${reason})`);
      if (page.sub?.active === false) page.sub = null;
      showRevoked("you no longer have access to this warehouse.");
    },
    onError({ code, message, ended }) {
      log(`subscription error ${code}: ${message}`);
      if (ended && code === "not_found") showRevoked("you may not read this warehouse.");
    },
  });
}

// One item's changes: the warehouse subscription above receives every item's, this one asks the
// replica for one item's only (a filter, SPEC 5.2 rev 3: equality on the update's top-level
// "itemId"), so the other items' updates never reach it. Opened by an item's "watch" button.
function watchItem(id) {
  unwatch();
  if (!page.client) return;
  const feed = $("#watch-log");
  $("#watch-item").textContent = id;
  $("#watch").hidden = false;
  const note = (text) => {
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
    feed.prepend(li);
  };
  page.watch = page.client.subscribe({
    channel: "warehouse",
    scope: { warehouse: page.warehouse },
    filter: { itemId: id },
    validate: validItemUpdate,
    onSubscribed: ({ resumed }) => resumed || note("watching: only this item's changes arrive here"),
    onUpdate(data) {
      if (data.type === "item.deleted") note("deleted");
      else note(Number.isInteger(data.quantity) ? `quantity ${data.quantity}` : "changed (renamed)");
    },
    onResync: ({ reason }) => note(`resync (${reason}): changes may have been missed`),
    onRevoked: () => note("access revoked: the feed ended"),
    onError: ({ code, message, ended }) => note(`error ${code}: ${message}${ended ? " (the feed ended)" : ""}`),
  });
}

function unwatch() {
  page.watch?.unsubscribe();
  page.watch = null;
  $("#watch").hidden = true;
  $("#watch-log").replaceChildren();
}

// --auth jwt: the socket's credential is a short-lived JWT from the app, not the session cookie. The
// client asks for one for every socket and again on auth_expiring, and never caches it.
async function socketToken() {
  const res = await api("POST", "/api/token", {});
  // The app's session ended: show the sign-in, as a refused cookie does (the client keeps retrying
  // with backoff, and signing in again reconnects it).
  if (res.status === 401) signedOut();
  if (!res.ok) throw new Error(`POST /api/token: ${res.status} ${res.data?.message ?? ""}`);
  return res.data.token;
}

function startLive() {
  if (page.client) {
    page.client.reconnect();
    return;
  }
  const options = { app: "inventory" };
  if (page.socketAuth === "jwt") {
    options.token = socketToken;
    log("the live socket authenticates with a JWT from POST /api/token");
  }
  page.client = new LiveClient(options);
  page.client.onState((state, info) => {
    renderState(state, info);
    if (state === "stopped" && info?.error?.code === "unauthorized") signedOut();
  });
  page.client.onError(({ code, message }) => log(`socket error ${code}: ${message}`));
}

async function subscribeWarehouseList() {
  const cursor = await reloadWarehouses();
  if (!page.client || page.listSub) return;
  page.listSub = page.client.subscribe({
    channel: "my_warehouses",
    cursor: typeof cursor === "string" ? cursor : undefined,
    validate: validItemUpdate,
    onUpdate() {}, // the page of the open warehouse shows the changes
    onResync({ reason }) {
      log(`my warehouses: resync (${reason})`);
      reloadWarehouses();
    },
    onSubscribed({ resumed }) {
      if (!resumed) reloadWarehouses();
    },
  });
}

// --- actions ------------------------------------------------------------------------------------

async function increment(id) {
  const item = page.items.get(id);
  if (!item) return;
  // No optimistic change: the new value comes back through the live update.
  const res = await api("POST", `/api/items/${encodeURIComponent(id)}/quantity`, { quantity: item.quantity + 1 });
  if (!res.ok) log(`+1 on ${id} failed: ${res.status} ${res.data?.message ?? ""}`);
}

async function changeMember(publicId, action) {
  const res = await api("POST", `/api/warehouses/${encodeURIComponent(publicId)}/members/${action}`, {
    subject: page.subject,
  });
  if (!res.ok) {
    log(`${action} failed: ${res.status} ${res.data?.message ?? ""}`);
    return false;
  }
  log(`${action === "add" ? "added" : "removed"} ${page.subject} ${action === "add" ? "to" : "from"} ${publicId}`);
  return true;
}

async function signin() {
  const res = await api("POST", "/api/signin", {});
  if (!res.ok) {
    log(`sign-in failed: ${res.status}`);
    return;
  }
  await start();
}

async function signout() {
  await api("POST", "/api/signout", {});
  page.client?.close();
  page.client = null;
  page.sub = null;
  page.listSub = null;
  page.watch = null;
  signedOut();
}

function signedOut() {
  page.subject = null;
  $("#user").textContent = "";
  $("#signin").hidden = false;
  $("#signout").hidden = true;
  $("#signed-out").hidden = false;
  $("#app").hidden = true;
}

async function start() {
  const me = await api("GET", "/api/me");
  if (me.status === 401) {
    signedOut();
    return;
  }
  page.subject = me.data.subject;
  page.socketAuth = me.data.socketAuth ?? "session";
  $("#user").textContent = page.subject;
  $("#signin").hidden = true;
  $("#signout").hidden = false;
  $("#signed-out").hidden = true;
  $("#app").hidden = false;
  startLive();
  await subscribeWarehouseList();
  await openWarehouse(page.warehouse);
}

$("#signin").addEventListener("click", signin);
$("#signout").addEventListener("click", signout);
$("#reload").addEventListener("click", () => reloadSnapshot());
$("#unwatch").addEventListener("click", unwatch);
$("#leave").addEventListener("click", () => changeMember(page.warehouse, "remove"));
$("#restore").addEventListener("click", async () => {
  if (await changeMember(page.warehouse, "add")) openWarehouse(page.warehouse);
});
window.addEventListener("popstate", () => {
  const w = new URLSearchParams(location.search).get("warehouse") || "north";
  if (w !== page.warehouse) openWarehouse(w);
});
window.addEventListener("online", () => page.client?.reconnect());
window.inventoryDemo = page; // for a browser test's inspection

start();
