// The browser end-to-end test (issue 7): headless Chromium against the real demo stack.
//
//   node tests/e2e/browser.test.mjs [--demo build/examples/inventory/outlive_demo_run]
//                                   [--artifacts build/e2e-artifacts] [--chromium /usr/bin/chromium]
//                                   [--gateway nginx|haproxy] [--auth session|jwt] [--app-server cpp|ts]
//                                   [--websockets allowed|refused]
//
// It starts `outlive_demo_run --port 0 --data <temp> --state <file> --gateway <gateway>`
// (and `--auth jwt` with --auth jwt: the page's sockets sign in with the app's tokens; and
// `--app-server ts` with --app-server ts: the app is the TypeScript server of examples/inventory-ts,
// whose routes publish with @outlive/server and whose routes() answers the replicas' channels
// `warehouse` and `my_warehouses` as hooks: the steps below then also check, on the replicas'
// /metrics, that the subscription and the revocation went through those hooks)
// (PostgreSQL, NATS JetStream, two replicas (inventory_replica), the inventory app and nginx or
// HAProxy), opens the demo page in Chromium and checks, in the page:
//
//   1. sign-in (demo session) and the warehouse snapshot;
//   2. a change made through the demo HTTP API shows within one second;
//   3. the replica holding the page's socket gets SIGTERM (close 1012): the page reconnects through
//      the gateway to the other replica, resumes from its cursor and shows the next change, with no
//      reload (same JS context, no snapshot load) and no `resync`;
//   4. a long disconnect: the page goes offline (its TCP connections are cut), more than the window
//      (5,000 updates) is published, the page comes back online: `resync` (reason window), the
//      snapshot is loaded again and shows the change made while it was away;
//   5. ada is removed from the warehouse (membership change + access update in one transaction):
//      the page shows `revoked`, and an update of the warehouse published afterwards never reaches
//      the tab.
//
// The page talks to the gateway through a small TCP proxy owned by this test, so "offline" is a
// real network cut (Chromium's offline emulation leaves open websockets alone); the proxy's origin
// is passed to the demo with --origin. Screenshots of every state go to the artifacts folder, with
// the demo's logs. Every wait has a deadline; nothing sleeps for a fixed time.
import { spawn, execFile } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");

// --- options -------------------------------------------------------------------------------------

function parseArgs(argv) {
  const o = {
    demo: process.env.OUTLIVE_DEMO_RUN || path.join(repo, "build/examples/inventory/outlive_demo_run"),
    artifacts: process.env.OUTLIVE_E2E_ARTIFACTS || path.join(repo, "build/e2e-artifacts"),
    chromium: process.env.CHROMIUM || "/usr/bin/chromium",
    gateway: process.env.OUTLIVE_E2E_GATEWAY || "nginx",
    auth: process.env.OUTLIVE_E2E_AUTH || "session",
    "app-server": process.env.OUTLIVE_E2E_APP_SERVER || "cpp",
    // "refused" (CTest e2e:browser-sse-fallback): the gateway answers every websocket upgrade on
    // /api/<app>/live with 403, as a blocking corporate proxy would; the page must fall back to
    // SSE by itself (SPEC 5.9). nginx only.
    websockets: process.env.OUTLIVE_E2E_WEBSOCKETS || "allowed",
  };
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in o) || i + 1 >= argv.length) {
      console.error(`usage: browser.test.mjs [--demo FILE] [--artifacts DIR] [--chromium FILE] [--gateway nginx|haproxy] [--auth session|jwt] [--app-server cpp|ts] [--websockets allowed|refused] (bad: ${argv[i]})`);
      process.exit(2);
    }
    o[name] = argv[++i];
  }
  o.demo = path.resolve(o.demo);
  o.ts = o["app-server"] === "ts";
  o.artifacts = path.resolve(o.artifacts);
  if (o.websockets !== "allowed" && !(o.websockets === "refused" && o.gateway === "nginx")) {
    console.error("browser.test.mjs: --websockets refused works with --gateway nginx only");
    process.exit(2);
  }
  return o;
}

const options = parseArgs(process.argv.slice(2));
const started = Date.now();

// --- small helpers -------------------------------------------------------------------------------

const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;

/** Runs one numbered step; prints what it checked and how long it took. */
async function step(title, fn) {
  process.stdout.write(`e2e: ${title} ... `);
  const t0 = Date.now();
  try {
    const detail = await fn();
    console.log(`ok${detail ? ` (${detail})` : ""} [${Date.now() - t0} ms]`);
    return detail;
  } catch (error) {
    console.log("FAILED");
    error.message = `${title}: ${error.message}`;
    throw error;
  }
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

/** Polls `probe` until it returns a value other than undefined/false, or throws after `timeout` ms. */
async function until(what, probe, { timeout = 15_000, interval = 100 } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined && value !== false && value !== null) return value;
    } catch (error) {
      if (error.fatal) throw error;
      last = error;
    }
    if (Date.now() > deadline) {
      throw new Error(`${what}: not within ${timeout} ms${last ? ` (last error: ${last.message})` : ""}`);
    }
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}

function psql(database, sql) {
  return new Promise((resolve, reject) => {
    execFile("psql", [database, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], { timeout: 60_000 },
      (error, stdout, stderr) => (error ? reject(new Error(`psql: ${stderr || error.message}`)) : resolve(stdout.trim())));
  });
}

/**
 * The sum of outlive_hook_calls_total{app="inventory",channel,op,result="ok"} on the given replicas
 * (those that have exited count 0): the calls the replicas made to the TypeScript server's hooks.
 */
async function hookCallsOk(replicas, channel, op) {
  let sum = 0;
  for (const replica of replicas) {
    let text = "";
    try {
      const res = await fetch(`http://127.0.0.1:${replica.port}/metrics`, { signal: AbortSignal.timeout(2000) });
      text = await res.text();
    } catch {
      continue;
    }
    for (const line of text.split("\n")) {
      if (!line.startsWith("outlive_hook_calls_total{")) continue;
      const labels = line.slice(line.indexOf("{") + 1, line.lastIndexOf("}"));
      const want = ['app="inventory"', `channel="${channel}"`, `op="${op}"`, 'result="ok"'];
      if (want.every((l) => labels.split(",").includes(l))) sum += Number(line.slice(line.lastIndexOf("}") + 1));
    }
  }
  return sum;
}

/** outlive_sockets{app="inventory"} of one replica, read from its /metrics. */
async function socketsOn(replica) {
  const res = await fetch(`http://127.0.0.1:${replica.port}/metrics`, { signal: AbortSignal.timeout(2000) });
  const text = await res.text();
  const m = /^outlive_sockets\{app="inventory"\} (\d+)/m.exec(text);
  return m ? Number(m[1]) : 0;
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// --- the network between the page and the gateway ------------------------------------------------

/** A TCP proxy to the gateway whose cable can be pulled (cut) and plugged in again (restore). */
async function startProxy() {
  const pairs = new Set();
  const proxy = { target: 0, open: true, port: 0 };
  const server = net.createServer((client) => {
    if (!proxy.open || !proxy.target) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(proxy.target, "127.0.0.1");
    const pair = { client, upstream };
    pairs.add(pair);
    const end = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  proxy.port = server.address().port;
  proxy.cut = () => {
    proxy.open = false;
    for (const { client, upstream } of [...pairs]) {
      client.resetAndDestroy();
      upstream.destroy();
    }
  };
  proxy.restore = () => {
    proxy.open = true;
  };
  proxy.close = () => {
    proxy.cut();
    server.close();
  };
  return proxy;
}

// --- the demo stack ------------------------------------------------------------------------------

function startDemo(work, origin) {
  const stateFile = path.join(work, "state.json");
  const logFile = path.join(work, "outlive_demo_run.log");
  const log = fs.openSync(logFile, "w");
  const args = ["--port", "0", "--data", path.join(work, "demo"), "--state", stateFile, "--origin", origin,
    "--gateway", options.gateway, ...(options.auth === "jwt" ? ["--auth", "jwt"] : []),
    ...(options.ts ? ["--app-server", "ts"] : [])];
  // setpriv --pdeathsig: if this test is killed (a CTest timeout), the demo gets SIGTERM and stops
  // its children; otherwise they would outlive us.
  const haveSetpriv = fs.existsSync("/usr/bin/setpriv");
  const child = haveSetpriv
    ? spawn("/usr/bin/setpriv", ["--pdeathsig", "TERM", "--", options.demo, ...args], { stdio: ["ignore", log, log] })
    : spawn(options.demo, args, { stdio: ["ignore", log, log] });
  fs.closeSync(log);
  const demo = { child, stateFile, logFile, exited: null, state: null };
  child.on("exit", (code, signal) => {
    demo.exited = { code, signal };
  });
  child.on("error", (error) => {
    demo.exited = { error };
  });
  return demo;
}

function tail(file, bytes = 3000) {
  try {
    const text = fs.readFileSync(file, "utf8");
    return text.slice(-bytes);
  } catch {
    return `(no ${file})`;
  }
}

async function stopDemo(demo) {
  if (!demo || demo.exited) return;
  demo.child.kill("SIGTERM");
  const deadline = Date.now() + 60_000;
  while (!demo.exited && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 100));
  if (!demo.exited) {
    console.error("e2e: the demo did not stop within 60 s of SIGTERM: SIGKILL");
    demo.child.kill("SIGKILL");
  }
}

const DONE = Symbol("done");

// --- websockets refused (SPEC 5.9) ---------------------------------------------------------------

/** nginx's prefix, from its error log's path (<prefix>/logs/error.log). */
function nginxPrefix(state) {
  return path.dirname(path.dirname(state.gateway.log));
}

/**
 * Rewrites the running nginx's configuration so that an upgrade on /api/<app>/live is answered 403
 * (what a proxy that blocks websockets does) while /live/sse passes, reloads it, and waits until
 * the gateway answers that way.
 */
async function refuseWebsockets(state) {
  await step("0. the gateway refuses websocket upgrades (403), /live/sse passes", async () => {
    const conf = path.join(nginxPrefix(state), "nginx.conf");
    const text = fs.readFileSync(conf, "utf8");
    const live = 'location ~ "^/api/[a-z0-9][a-z0-9-]{0,62}/live$" {\n';
    check(text.includes(live), `no live location in ${conf}`);
    fs.writeFileSync(conf, text.replace(live, `${live}      if ($http_upgrade) { return 403; }\n`));
    process.kill(state.gateway.pid, "SIGHUP");
    const url = `${state.url.replace(/\/$/, "")}/api/inventory/live`;
    let attempts = 0;
    const status = await until("nginx to refuse an upgrade with 403", () => new Promise((resolve) => {
      attempts += 1;
      const req = http.get(url, { headers: { Connection: "Upgrade", Upgrade: "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==" } });
      req.on("response", (res) => {
        res.resume();
        resolve(res.statusCode === 403 ? 403 : undefined);
      });
      req.on("upgrade", (res, socket) => {
        socket.destroy();
        resolve(undefined);
      });
      req.on("error", () => resolve(undefined));
    }), { timeout: 15_000, interval: 200 });
    // nginx logs a request when it ends, after its response is sent: wait for the probe's 403 to be
    // logged, so that every refused upgrade after it is the page's. An earlier probe may have met a
    // worker from before the reload (101) and be logged first; counting any line would then let the
    // 403 arrive late and be taken for the page's.
    await until("nginx to log the probe's 403", () => liveRequests(state).some(([s, p]) => s === 403 && p.endsWith("/live")));
    state.probes = liveRequests(state).length;
    return `upgrade answered ${status} after ${attempts} probe(s); nginx logged ${JSON.stringify(liveRequests(state))}`;
  });
}

/** Requests to /api/inventory/live(/sse) in nginx's access log: [status, path, method]. */
function liveRequests(state) {
  const log = fs.readFileSync(path.join(nginxPrefix(state), "logs/access.log"), "utf8");
  return [...log.matchAll(/"(GET|POST) (\/api\/inventory\/live(?:\/sse)?)[^"]*" (\d{3})/g)].map((m) => [Number(m[3]), m[2], m[1]]);
}

async function sseFallbackSteps(t) {
  const { page, context, state, api, counter, watchQuantity, seenAt, screenshot, pageOrigin, quantityCell } = t;
  const item = "n-bolts";
  let quantity = 0;
  await step("1. sign in: two refused websocket opens, then the page is live over SSE by itself", async () => {
    await page.goto(`${pageOrigin}/?warehouse=north`);
    await page.click("#signin");
    await page.waitForSelector('#state[data-state="live"]', { timeout: 30_000 });
    await page.waitForSelector(quantityCell(item));
    const cookie = (await context.cookies()).find((c) => c.name === "session");
    check(cookie, "no session cookie after sign-in");
    t.setCookie(`session=${cookie.value}`);
    const transport = await page.evaluate(() => window.inventoryDemo.client.transport);
    check(transport === "sse", `the page's client uses ${transport}, not sse`);
    const remembered = await page.evaluate(() => Object.entries(sessionStorage).filter(([k]) => k.startsWith("outlive.transport")));
    check(remembered.length === 1 && remembered[0][1] === "sse", `sessionStorage holds ${JSON.stringify(remembered)}`);
    const refusedIn = (requests) => requests.filter(([s, p]) => s === 403 && p.endsWith("/live")).length;
    // nginx writes a request's line just after its response: give the second refusal's a moment.
    await until("nginx to log the page's refused upgrades", () => refusedIn(liveRequests(state).slice(state.probes)) >= 2, { timeout: 5_000 }).catch(() => {});
    const requests = liveRequests(state).slice(state.probes);
    const refused = refusedIn(requests);
    // A stream is logged when it ends; the ones opened so far: a stream request of the right kind
    // (a token goes in a POST body, cookies with a GET).
    const method = options.auth === "jwt" ? "POST" : "GET";
    const opened = t.streams();
    check(opened.length >= 1, "the page made no request to /live/sse");
    check(opened.every((r) => r.method === method && (method === "GET") === r.url.includes("subs=")),
      `stream requests ${JSON.stringify(opened)}, expected ${method}s`);
    check(t.sockets() === 2, `the page opened ${t.sockets()} websockets, expected 2 (both refused)`);
    check(refused === 2, `expected exactly 2 refused upgrades before the fallback, nginx logged ${refused}: ${JSON.stringify(requests)} after the probes' ${JSON.stringify(liveRequests(state).slice(0, state.probes))}`);
    await page.waitForFunction(() => document.querySelector("#cursor").textContent.length > 0);
    const snapshot = await api("GET", "/api/warehouses/north");
    quantity = snapshot.items.find((it) => it.id === item).quantity;
    await page.evaluate(() => {
      window.__e2eContext = "kept";
    });
    await screenshot("01-sse-live");
    return `${refused} upgrades refused (403), then SSE (${method}); ${item} = ${quantity}`;
  });

  await step("2. a change through the demo HTTP API shows in the page within 1 s, over SSE", async () => {
    const loads = await counter("loads");
    quantity += 1;
    await watchQuantity(item, quantity);
    const t0 = Date.now();
    await api("POST", `/api/items/${item}/quantity`, { quantity });
    const ms = (await seenAt(`${item} = ${quantity}`)) - t0;
    check(ms < 1000, `the change showed after ${ms} ms (limit 1000 ms)`);
    check((await counter("loads")) === loads, "the page loaded the snapshot again instead of applying the update");
    await screenshot("02-sse-update");
    return `${ms} ms from the POST to the page`;
  });

  await step("3. SIGKILL the replica serving the stream: the page resumes on the other, no update lost", async () => {
    const holder = await until("the replica holding the page's stream", async () => {
      const counts = await Promise.all(state.replicas.map(socketsOn));
      const holding = state.replicas.filter((_, i) => counts[i] > 0);
      return holding.length === 1 && counts.reduce((a, b) => a + b, 0) === 1 ? holding[0] : undefined;
    });
    const other = state.replicas.find((r) => r !== holder);
    const before = { resyncs: await counter("resyncs"), loads: await counter("loads"), reconnects: await counter("reconnects"), updates: await counter("updates"), navigations: t.navigations() };
    const logLines = () => page.$$eval("#log li", (lis) => lis.map((li) => li.textContent).reverse());
    const logBefore = (await logLines()).length;
    process.kill(holder.pid, "SIGKILL");
    await until(`${holder.replica} (pid ${holder.pid}) to exit`, () => !alive(holder.pid), { timeout: 15_000 });
    // Changes made while the page has no stream: the resumed one must replay them, in order.
    const changes = [];
    for (let i = 0; i < 3; i++) {
      quantity += 1;
      changes.push(quantity);
      await api("POST", `/api/items/${item}/quantity`, { quantity });
    }
    await watchQuantity(item, quantity);
    await seenAt(`${item} = ${quantity} after the failover`, 30_000);
    await page.waitForSelector('#state[data-state="live"]');
    // Each change exactly once, in order: the resumed stream replayed from the page's cursor.
    const applied = (await logLines()).slice(logBefore).filter((l) => l.includes(`${item}: quantity`));
    const expected = changes.map((q) => `${item}: quantity ${q}`);
    check(applied.length === expected.length && applied.every((l, i) => l.endsWith(expected[i])),
      `the page applied ${JSON.stringify(applied)}, expected ${JSON.stringify(expected)}`);
    check((await counter("updates")) === before.updates + changes.length,
      `the page counted ${(await counter("updates")) - before.updates} updates, expected ${changes.length}`);
    check((await counter("reconnects")) > before.reconnects, "the page did not count a reconnect");
    check((await page.evaluate(() => window.inventoryDemo.client.transport)) === "sse", "the page left SSE");
    check((await page.evaluate(() => window.__e2eContext)) === "kept", "the page's JS context was replaced (a reload)");
    check(t.navigations() === before.navigations, "the page navigated");
    check((await counter("resyncs")) === before.resyncs, "the page counted a resync");
    check((await counter("loads")) === before.loads, "the page loaded the snapshot again");
    await until(`the page's stream on ${other.replica}`, async () => (await socketsOn(other)) === 1);
    // one more change, live on the other replica
    quantity += 1;
    await watchQuantity(item, quantity);
    const t0 = Date.now();
    await api("POST", `/api/items/${item}/quantity`, { quantity });
    const live = (await seenAt(`${item} = ${quantity} on ${other.replica}`)) - t0;
    check(live < 1000, `the change showed after ${live} ms (limit 1000 ms)`);
    check(t.sockets() === 2, `the page tried websockets again (${t.sockets()} opened)`);
    await screenshot("03-sse-after-replica-kill");
    return `${holder.replica} killed, ${changes.length} changes made meanwhile all shown, then live on ${other.replica} in ${live} ms, no resync, no reload`;
  });
}

// --- the test ------------------------------------------------------------------------------------

async function main() {
  fs.rmSync(options.artifacts, { recursive: true, force: true });
  fs.mkdirSync(options.artifacts, { recursive: true });
  check(fs.existsSync(options.demo), `no demo runner at ${options.demo} (build the target outlive_demo_run)`);
  check(fs.existsSync(options.chromium), `no Chromium at ${options.chromium} (apt-get install chromium)`);

  const work = fs.mkdtempSync(path.join(os.tmpdir(), "outlive-e2e-"));
  fs.chmodSync(work, 0o755); // Postgres runs as user postgres when we are root: it must enter the folder
  const shots = [];
  let demo = null;
  let browser = null;
  let proxy = null;
  let page = null;
  let failed = false;
  const frames = []; // every frame the page's sockets received (frames.json in the artifacts)

  const screenshot = async (name) => {
    const file = path.join(options.artifacts, `${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    shots.push(file);
    return file;
  };

  try {
    proxy = await startProxy();
    const pageOrigin = `http://127.0.0.1:${proxy.port}`;

    const appName = options.ts ? "the TypeScript app (examples/inventory-ts)" : "app";
    const stack = await step(`start the demo stack (Postgres, NATS, 2 replicas, ${appName}, ${options.gateway})`, async () => {
      demo = startDemo(work, pageOrigin);
      await until("the demo's state file", () => {
        if (demo.exited) throw Object.assign(new Error("outlive_demo_run exited"), { fatal: true });
        return fs.existsSync(demo.stateFile) && JSON.parse(fs.readFileSync(demo.stateFile, "utf8"));
      }, { timeout: 150_000, interval: 200 }).catch((error) => {
        throw new Error(`${error.message}; outlive_demo_run ${JSON.stringify(demo.exited)}; its output:\n${tail(demo.logFile)}`);
      });
      demo.state = JSON.parse(fs.readFileSync(demo.stateFile, "utf8"));
      check(demo.state.replicas.length === 2, "expected two replicas");
      check(demo.state.gateway.name === options.gateway, `the demo runs ${demo.state.gateway.name}, not ${options.gateway}`);
      check((demo.state.app.server ?? "cpp") === options["app-server"], `the demo's app server is ${demo.state.app.server}, not ${options["app-server"]}`);
      proxy.target = demo.state.gateway.port;
      return `${demo.state.gateway.name} ${demo.state.url}, replicas ${demo.state.replicas.map((r) => `${r.replica} pid ${r.pid}`).join(", ")}`;
    });
    void stack;
    const state = demo.state;
    if (options.websockets === "refused") await refuseWebsockets(state);
    const gateway = state.url.replace(/\/$/, "");
    const database = state.database;
    const warehouseKeys = Object.fromEntries(
      (await psql(database, "SELECT public_id || '=' || id FROM inventory.warehouses")).split("\n").map((l) => l.split("=")),
    );
    check(warehouseKeys.north && warehouseKeys.south, "the demo data has no warehouses north and south");

    browser = await chromium.launch({
      executablePath: options.chromium,
      // --no-sandbox: CI runs as root (and containers rarely allow Chromium's user-namespace sandbox).
      args: ["--no-sandbox", "--disable-dev-shm-usage"],
      timeout: 60_000,
    });
    const context = await browser.newContext({ viewport: { width: 1100, height: 860 } });
    page = await context.newPage();
    page.setDefaultTimeout(15_000);
    // Uncaught exceptions in the page fail the test. (Console errors are expected: the 401 before
    // sign-in, and failed socket attempts while a replica stops or the page is offline.)
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(e.message));
    let navigations = 0;
    page.on("framenavigated", (frame) => {
      if (frame === page.mainFrame()) navigations += 1;
    });
    // Every frame the page's sockets receive, in order, tagged with the socket it came on.
    const streams = []; // the page's requests to /live/sse (SSE, SPEC 5.9)
    page.on("request", (r) => {
      if (r.url().includes("/live/sse")) streams.push({ method: r.method(), url: r.url() });
    });
    let sockets = 0;
    page.on("websocket", (ws) => {
      const socket = ++sockets;
      ws.on("framereceived", ({ payload }) => {
        try {
          frames.push({ socket, at: Date.now(), ...JSON.parse(String(payload)) });
        } catch {
          frames.push({ socket, at: Date.now(), type: "?" });
        }
      });
    });
    const framesSince = (index, type) => frames.slice(index).filter((f) => !type || f.type === type);

    let cookie = "";
    const api = async (method, route, body) => {
      const res = await fetch(gateway + route, {
        method,
        headers: { Cookie: cookie, ...(body ? { "Content-Type": "application/json" } : {}) },
        body: body ? JSON.stringify(body) : undefined,
        signal: AbortSignal.timeout(10_000),
      });
      const data = await res.json().catch(() => null);
      check(res.ok, `${method} ${route} answered ${res.status}: ${JSON.stringify(data)}`);
      return data;
    };
    const counter = async (name) => Number(await page.textContent(`#${name}`));
    const quantityCell = (id) => `#items tr[data-item="${id}"] .quantity`;
    // Resolves with the page's Date.now() when the item's quantity cell shows `quantity`.
    const watchQuantity = (id, quantity) =>
      page.evaluate(
        ({ selector, text }) => {
          window.__e2eSeen = new Promise((resolve) => {
            const seen = () => {
              const cell = document.querySelector(selector);
              if (cell && cell.textContent === text) {
                observer.disconnect();
                resolve(Date.now());
              }
            };
            const observer = new MutationObserver(seen);
            observer.observe(document.querySelector("#items tbody"), { subtree: true, childList: true, characterData: true });
            seen();
          });
        },
        { selector: quantityCell(id), text: String(quantity) },
      );
    // The page's Date.now() when the watched quantity showed (the same clock as ours).
    const seenAt = async (what, timeout = 15_000) => {
      let timer;
      const result = await Promise.race([
        page.evaluate(() => window.__e2eSeen),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`${what}: not shown within ${timeout} ms`)), timeout);
        }),
      ]);
      clearTimeout(timer);
      return result;
    };

    if (options.websockets === "refused") {
      await sseFallbackSteps({ page, context, state, api, counter, watchQuantity, seenAt, screenshot, pageOrigin, quantityCell,
        navigations: () => navigations, sockets: () => sockets, streams: () => streams, setCookie: (c) => { cookie = c; } });
      check(pageErrors.length === 0, `uncaught exceptions in the page: ${pageErrors.join("; ")}`);
      throw DONE;
    }

    // 1 ------------------------------------------------------------------------------------------
    const item = "n-bolts";
    let quantity = 0;
    await step("1. sign in (demo session) and show the warehouse snapshot", async () => {
      await page.goto(`${pageOrigin}/?warehouse=north`);
      await page.click("#signin");
      await page.waitForSelector('#state[data-state="live"]');
      await page.waitForSelector(`${quantityCell(item)}`);
      cookie = (await context.cookies()).filter((c) => c.name === "session").map((c) => `session=${c.value}`)[0];
      check(cookie, "no session cookie after sign-in");
      check((await page.textContent("#user")) === "user:ada", "the page does not show user:ada");
      check((await page.evaluate(() => window.inventoryDemo.socketAuth)) === options.auth,
        `the page's sockets do not use ${options.auth}`);
      // The page shows exactly the snapshot the API gives.
      const snapshot = await api("GET", "/api/warehouses/north");
      const byId = (a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
      const shown = (await page.$$eval("#items tbody tr[data-item]", (rows) =>
        rows.map((tr) => ({ id: tr.dataset.item, name: tr.querySelector(".name").textContent, quantity: Number(tr.querySelector(".quantity").textContent) })))).sort(byId);
      check(shown.length > 0 && JSON.stringify(shown) === JSON.stringify([...snapshot.items].sort(byId)),
        `the page shows ${JSON.stringify(shown)}, the snapshot is ${JSON.stringify(snapshot.items)}`);
      // Subscribed from the snapshot's cursor.
      await until("a subscribed frame", () => framesSince(0, "subscribed").length >= 1);
      await page.waitForFunction(() => document.querySelector("#cursor").textContent.length > 0);
      quantity = snapshot.items.find((it) => it.id === item).quantity;
      // Marks this JS context: a reload would lose it.
      await page.evaluate(() => {
        window.__e2eContext = "kept";
      });
      await screenshot("01-signed-in-snapshot");
      let hooks = "";
      if (options.ts) {
        // The subscriptions went through the TypeScript server's routes(): keys() and authorize().
        const keys = await hookCallsOk(state.replicas, "warehouse", "keys");
        const authorize = await hookCallsOk(state.replicas, "warehouse", "authorize");
        const collection = await hookCallsOk(state.replicas, "my_warehouses", "keys");
        check(keys >= 1 && authorize >= 1 && collection >= 1,
          `the replicas made no hook calls to the TypeScript server (warehouse keys ${keys}, authorize ${authorize}; my_warehouses keys ${collection})`);
        hooks = `; through the TypeScript hooks: warehouse keys ${keys}, authorize ${authorize}, my_warehouses keys ${collection}`;
      }
      return `${shown.length} items, ${item} = ${quantity}${hooks}`;
    });

    // 2 ------------------------------------------------------------------------------------------
    await step("2. a change through the demo HTTP API shows in the page within 1 s", async () => {
      const loads = await counter("loads");
      const framesBefore = frames.length;
      quantity += 1;
      await watchQuantity(item, quantity);
      const t0 = Date.now();
      await api("POST", `/api/items/${item}/quantity`, { quantity });
      const at = await seenAt(`${item} = ${quantity}`);
      const ms = at - t0;
      check(ms < 1000, `the change showed after ${ms} ms (limit 1000 ms)`);
      await until("the update frame that carried the change", () =>
        framesSince(framesBefore, "update").some((f) => f.data?.itemId === item && f.data?.quantity === quantity));
      check((await counter("loads")) === loads, "the page loaded the snapshot again instead of applying the update");
      await screenshot("02-live-update");
      return `${ms} ms from the POST to the page`;
    });

    // 3 ------------------------------------------------------------------------------------------
    await step("3. SIGTERM the page's replica: reconnect to the other one, no reload, no resync", async () => {
      const holder = await until("the replica holding the page's socket", async () => {
        const counts = await Promise.all(state.replicas.map(socketsOn));
        const holding = state.replicas.filter((_, i) => counts[i] > 0);
        return holding.length === 1 && counts.reduce((a, b) => a + b, 0) === 1 ? holding[0] : undefined;
      });
      const other = state.replicas.find((r) => r !== holder);
      const before = {
        resyncs: await counter("resyncs"),
        loads: await counter("loads"),
        reconnects: await counter("reconnects"),
        navigations,
        frames: frames.length,
        sockets,
      };
      process.kill(holder.pid, "SIGTERM");
      await page.waitForFunction((n) => Number(document.querySelector("#reconnects").textContent) > n, before.reconnects);
      await until(`${holder.replica} (pid ${holder.pid}) to exit`, () => !alive(holder.pid), { timeout: 30_000 });
      await page.waitForSelector('#state[data-state="live"]');
      const closeCode = await page.getAttribute("#state", "data-close-code");
      check(closeCode === "1012", `the socket closed with ${closeCode}, expected 1012`);
      await until(`the page's socket on ${other.replica}`, async () => (await socketsOn(other)) === 1);
      // The next change, through the other replica.
      quantity += 1;
      await watchQuantity(item, quantity);
      const t0 = Date.now();
      await api("POST", `/api/items/${item}/quantity`, { quantity });
      const ms = (await seenAt(`${item} = ${quantity} after the failover`)) - t0;
      // Resumed, not reloaded: same JS context, no navigation, no snapshot load, no resync.
      check((await page.evaluate(() => window.__e2eContext)) === "kept", "the page's JS context was replaced (a reload)");
      check(navigations === before.navigations, "the page navigated");
      check((await counter("resyncs")) === before.resyncs, "the page counted a resync");
      check((await counter("loads")) === before.loads, "the page loaded the snapshot again");
      const resyncs = framesSince(before.frames, "resync");
      check(resyncs.length === 0, `resync frames after the failover: ${JSON.stringify(resyncs)}`);
      check(sockets > before.sockets, "no new socket was opened");
      const resumed = await until("both subscriptions resumed on the new socket", () => {
        const r = framesSince(before.frames, "subscribed").filter((f) => f.socket > before.sockets);
        return r.length >= 2 && r;
      }, { timeout: 5000 }).catch(() => []);
      check(resumed.length >= 2, `expected both subscriptions to resume on the new socket, got ${JSON.stringify(resumed)}`);
      await screenshot("03-after-replica-stop");
      return `${holder.replica} stopped (close 1012), page live on ${other.replica}, next change in ${ms} ms, resyncs ${before.resyncs}`;
    });

    // 4 ------------------------------------------------------------------------------------------
    await step("4. a long disconnect: more than the window is published, then resync and current data", async () => {
      const before = { resyncs: await counter("resyncs"), loads: await counter("loads"), frames: frames.length };
      const cursor = await page.evaluate(() => window.inventoryDemo.sub.cursor);
      check(typeof cursor === "string" && cursor, "the warehouse subscription has no cursor");
      // Pull the cable: the browser is offline and its connections are cut.
      await context.setOffline(true);
      proxy.cut();
      await page.waitForSelector('#state[data-state="reconnecting"]');
      await screenshot("04-offline");
      // Meanwhile: a change of the page's warehouse, then more than the window of other updates.
      quantity += 5;
      await api("POST", `/api/items/${item}/quantity`, { quantity });
      const filler = 5200;
      await psql(database,
        `SELECT count(*) FROM (SELECT events.publish_live('inventory', 'e2e-filler-' || (i % 64),
           jsonb_build_object('type', 'item.changed', 'itemId', 'filler-' || i)) FROM generate_series(1, ${filler}) i) s`);
      await psql(database, "SELECT events.wake('inventory')");
      const t0 = Date.now();
      await until("the outbox to be published", async () => (await psql(database, "SELECT count(*) FROM events.outbox")) === "0",
        { timeout: 90_000, interval: 250 });
      const published = Date.now() - t0;
      // The remaining replica's window must have moved past the page's cursor: a probe tab (its own
      // context, online) subscribes with that cursor until the replica answers resync (window).
      const probeContext = await browser.newContext({ storageState: await context.storageState() });
      try {
        const probe = await probeContext.newPage();
        await probe.goto(`${gateway}/healthz`);
        await until("the window to pass the page's cursor", () =>
          probe.evaluate(async ({ url, cursor, jwt }) => {
            // --auth jwt: the socket's credential is a token from the app, not the cookie.
            const token = jwt
              ? (await (await fetch("/api/token", { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" })).json()).token
              : null;
            return new Promise((resolve) => {
              const ws = new WebSocket(url);
              const done = (value) => {
                ws.close();
                resolve(value);
              };
              ws.onopen = () => {
                if (token) ws.send(JSON.stringify({ type: "auth", token }));
                ws.send(JSON.stringify({ type: "sub", id: "probe", channel: "warehouse", scope: { warehouse: "north" }, cursor }));
              };
              ws.onmessage = (event) => {
                const f = JSON.parse(event.data);
                if (f.type === "resync") done(f.reason === "window");
                else if (f.type === "subscribed" || f.type === "error") done(false);
              };
              ws.onclose = () => resolve(false);
              setTimeout(() => done(false), 5000);
            });
          }, { url: `${gateway.replace(/^http/, "ws")}/api/inventory/live`, cursor, jwt: options.auth === "jwt" }),
        { timeout: 30_000, interval: 500 }); // at most 2 opens a second: the limit is 5 per person
      } finally {
        await probeContext.close();
      }
      // Plug the cable in again: the browser's "online" event makes the page reconnect now.
      proxy.restore();
      await context.setOffline(false);
      await page.waitForFunction((n) => Number(document.querySelector("#resyncs").textContent) > n, before.resyncs);
      await page.waitForSelector('#state[data-state="live"]');
      await page.waitForFunction(({ selector, text }) => document.querySelector(selector)?.textContent === text,
        { selector: quantityCell(item), text: String(quantity) });
      const resyncs = framesSince(before.frames, "resync");
      check(resyncs.some((f) => f.reason === "window"), `no resync (window) frame: ${JSON.stringify(resyncs)}`);
      check((await counter("resyncs")) === before.resyncs + 1, "expected exactly one resync of the warehouse subscription");
      check((await counter("loads")) > before.loads, "the page did not load the snapshot again");
      check((await page.evaluate(() => window.__e2eContext)) === "kept", "the page's JS context was replaced (a reload)");
      await screenshot("05-resync-recovered");
      return `${filler} updates published in ${secs(published)}; resync (window), snapshot reloaded, ${item} = ${quantity}`;
    });

    // 5 ------------------------------------------------------------------------------------------
    await step("5. ada is removed from the warehouse: revoked, and nothing published afterwards arrives", async () => {
      const framesBefore = frames.length;
      const authorizeBefore = options.ts ? await hookCallsOk(state.replicas, "warehouse", "authorize") : 0;
      const t0 = Date.now();
      await api("POST", "/api/warehouses/north/members/remove", { subject: "user:ada" });
      await page.waitForSelector("#revoked", { state: "visible" });
      const ms = Date.now() - t0;
      const revoked = framesSince(framesBefore, "revoked");
      check(revoked.length === 1 && revoked[0].reason === "access_denied", `revoked frames: ${JSON.stringify(revoked)}`);
      // An update of north published after the access update, then one of south (which the page's
      // my_warehouses collection still follows) as a marker: once the marker arrives, the north
      // update would have arrived before it (the topic's order), had it been delivered.
      const afterRevoked = frames.length;
      await psql(database, `SELECT events.publish_live('inventory', '${warehouseKeys.north}',
        '{"type": "item.changed", "itemId": "${item}", "quantity": 999}'::jsonb)`);
      await psql(database, "SELECT events.wake('inventory')");
      await until("the north update to be published", async () => (await psql(database, "SELECT count(*) FROM events.outbox")) === "0");
      await psql(database, `SELECT events.publish_live('inventory', '${warehouseKeys.south}',
        '{"type": "item.changed", "itemId": "e2e-marker"}'::jsonb)`);
      await psql(database, "SELECT events.wake('inventory')");
      await until("the south marker on the page's socket", () =>
        framesSince(afterRevoked, "update").some((f) => f.key === warehouseKeys.south && f.data?.itemId === "e2e-marker"));
      const leaked = framesSince(framesBefore, "update").filter((f) => f.key === warehouseKeys.north);
      check(leaked.length === 0, `updates of north reached the tab after the revocation: ${JSON.stringify(leaked)}`);
      check((await page.textContent(quantityCell(item))) !== "999", "the page shows the update published after the revocation");
      check((await page.textContent("#revoked")).includes("revoked"), "the revoked notice does not say revoked");
      await screenshot("06-revoked");
      let hooks = "";
      if (options.ts) {
        // The access update re-checked the subscriber through the TypeScript authorize().
        const authorize = await hookCallsOk(state.replicas, "warehouse", "authorize");
        check(authorize > authorizeBefore, `no authorize call to the TypeScript server after the access update (${authorizeBefore} before, ${authorize} after)`);
        hooks = `; decided by the TypeScript authorize() (${authorize - authorizeBefore} call(s))`;
      }
      return `revoked after ${ms} ms; the later north update did not arrive${hooks}`;
    });

    check(pageErrors.length === 0, `uncaught exceptions in the page: ${JSON.stringify(pageErrors)}`);
  } catch (error) {
    // DONE: the steps of --websockets refused are all (the later steps need websocket frames)
    if (error !== DONE) {
      failed = true;
      console.error(`\ne2e: FAILED: ${error.stack || error.message}`);
      if (page) {
        try {
          const file = path.join(options.artifacts, "failure.png");
          await page.screenshot({ path: file, fullPage: true });
          shots.push(file);
          const lines = await page.$$eval("#log li", (lis) => lis.map((li) => li.textContent).reverse());
          console.error(`e2e: the page's log ("What happened", oldest first):\n  ${lines.join("\n  ")}`);
        } catch {
          // the browser is gone
        }
      }
      if (demo) console.error(`e2e: outlive_demo_run's output (tail):\n${tail(demo.logFile)}`);
    }
  } finally {
    if (frames.length) {
      fs.writeFileSync(path.join(options.artifacts, "frames.json"), `${JSON.stringify(frames, null, 1)}\n`);
    }
    if (browser) await browser.close().catch(() => {});
    await stopDemo(demo);
    if (proxy) proxy.close();
    // The demo's logs are artifacts too (its data folder is ours: it removes nothing of it).
    try {
      if (demo?.state) {
        const logs = path.join(options.artifacts, "logs");
        fs.cpSync(demo.state.logs, logs, { recursive: true });
        // nginx's error log is in its prefix, HAProxy's (its stdout) among the demo's logs.
        if (path.dirname(demo.state.gateway.log) !== demo.state.logs) {
          fs.cpSync(demo.state.gateway.log, path.join(logs, `${demo.state.gateway.name}-error.log`));
        }
      }
      if (demo) fs.copyFileSync(demo.logFile, path.join(options.artifacts, "outlive_demo_run.log"));
    } catch {
      // best effort
    }
    if (demo?.exited && !failed && demo.exited.code !== 0) {
      console.error(`e2e: outlive_demo_run exited with ${JSON.stringify(demo.exited)}`);
      failed = true;
    }
    fs.rmSync(work, { recursive: true, force: true });
  }
  console.log(`e2e: screenshots: ${shots.length ? shots.join(" ") : "none"}`);
  console.log(`e2e: artifacts in ${options.artifacts}`);
  console.log(`e2e: ${failed ? "FAILED" : "OK"} in ${secs(Date.now() - started)}`);
  return failed ? 1 : 0;
}

process.exitCode = await main();
