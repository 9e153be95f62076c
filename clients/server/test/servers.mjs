// Throwaway servers for the tests: PostgreSQL 15 (initdb into a temp dir, on a free loopback port,
// fsync off, as the postgres user when running as root, as src/harness/embedded_postgres.cpp does),
// the migrations (the outlive binary's `migrate`, or sql/*.sql applied the way it applies them),
// nats-server with JetStream, and a replica (`outlive serve`). Every wait has a deadline.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, readdirSync, existsSync, chownSync, rmSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";

const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(HERE, "../../..");
const PG_BIN = process.env.OUTLIVE_PG_BIN ?? "/usr/lib/postgresql/15/bin";

/** The outlive binary: $OUTLIVE_BIN (must exist when set), else build/src/app/outlive if built. */
export function outliveBinary() {
  if (process.env.OUTLIVE_BIN) {
    const bin = resolve(process.env.OUTLIVE_BIN);
    if (!existsSync(bin)) throw new Error(`OUTLIVE_BIN=${bin} does not exist`);
    return bin;
  }
  const bin = join(REPO, "build/src/app/outlive");
  return existsSync(bin) ? bin : null;
}

export function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

export async function until(what, ms, probe) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await probe();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms${last ? ` (last error: ${last.message})` : ""}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function postgresUser() {
  if (process.getuid() !== 0) return null;
  const line = readFileSync("/etc/passwd", "utf8").split("\n").find((l) => l.startsWith("postgres:"));
  if (!line) throw new Error("running as root but there is no 'postgres' user");
  const [, , uid, gid] = line.split(":");
  return { uid: Number(uid), gid: Number(gid) };
}

function tail(file) {
  try {
    return readFileSync(file, "utf8").split("\n").slice(-30).join("\n");
  } catch {
    return "";
  }
}

export async function startPostgres() {
  const runAs = postgresUser();
  const dir = mkdtempSync(join(tmpdir(), "outlive-server-pg-"));
  if (runAs) chownSync(dir, runAs.uid, runAs.gid);
  const data = join(dir, "data");
  const log = join(dir, "postgres.log");
  const asUser = (argv) => (runAs ? ["runuser", ["-u", "postgres", "--", ...argv]] : [argv[0], argv.slice(1)]);
  const [initCmd, initArgs] = asUser([`${PG_BIN}/initdb`, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]);
  execFileSync(initCmd, initArgs, { stdio: ["ignore", "ignore", "pipe"] });
  const port = await freePort();
  const [cmd, args] = asUser([
    `${PG_BIN}/postgres`, "-D", data, "-p", String(port), "-k", dir,
    "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
    "-c", "full_page_writes=off", "-c", `logging_collector=off`,
  ]);
  const { openSync } = await import("node:fs");
  const out = openSync(log, "a");
  if (runAs) chownSync(log, runAs.uid, runAs.gid);
  const child = spawn(cmd, args, { stdio: ["ignore", out, out] });
  let exited = false;
  child.on("exit", () => (exited = true));
  const url = `postgresql://postgres@127.0.0.1:${port}/postgres`;
  await until("postgres accepts connections", 30000, async () => {
    if (exited) throw new Error(`postgres exited:\n${tail(log)}`);
    const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 1000 });
    await c.connect();
    await c.end();
    return true;
  }).catch((e) => {
    if (exited) throw new Error(`postgres exited:\n${tail(log)}`);
    throw e;
  });
  return {
    url,
    port,
    async stop() {
      if (!exited) {
        child.kill("SIGINT"); // fast shutdown
        await until("postgres stops", 20000, () => exited).catch(() => child.kill("SIGKILL"));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Applies the migrations: `outlive migrate` when the binary is there, else sql/*.sql in one transaction as it does. */
export async function migrate(url) {
  const bin = outliveBinary();
  if (bin) {
    execFileSync(bin, ["migrate", "--database", url], { stdio: ["ignore", "ignore", "pipe"] });
    return "outlive migrate";
  }
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query("BEGIN");
    await c.query("SELECT pg_advisory_xact_lock(7301, 0)");
    await c.query("CREATE SCHEMA IF NOT EXISTS events");
    await c.query("CREATE TABLE IF NOT EXISTS events.schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
    const dir = join(REPO, "sql");
    for (const name of readdirSync(dir).filter((f) => f.endsWith(".sql")).sort()) {
      const done = await c.query("SELECT 1 FROM events.schema_migrations WHERE name = $1", [name]);
      if (done.rowCount) continue;
      await c.query(readFileSync(join(dir, name), "utf8"));
      await c.query("INSERT INTO events.schema_migrations (name) VALUES ($1)", [name]);
    }
    await c.query("COMMIT");
  } finally {
    await c.end();
  }
  return "sql/*.sql";
}

function portAccepts(port) {
  return new Promise((ok) => {
    import("node:net").then(({ connect }) => {
      const s = connect(port, "127.0.0.1");
      s.once("connect", () => {
        s.destroy();
        ok(true);
      });
      s.once("error", () => ok(false));
    });
  });
}

function stopper(child, name) {
  let exited = child.exitCode !== null;
  child.on("exit", () => (exited = true));
  return async () => {
    if (exited) return;
    child.kill("SIGTERM");
    await until(`${name} stops`, 15000, () => exited).catch(() => child.kill("SIGKILL"));
  };
}

export async function startNats() {
  const dir = mkdtempSync(join(tmpdir(), "outlive-server-nats-"));
  const port = await freePort();
  const conf = join(dir, "nats.conf");
  writeFileSync(conf, `listen: "127.0.0.1:${port}"\njetstream { store_dir: "${dir}/store" }\n`);
  const bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"].find(existsSync);
  if (!bin) throw new Error("nats-server not found");
  const child = spawn(bin, ["-c", conf], { stdio: "ignore" });
  await until("nats-server listens", 20000, () => {
    if (child.exitCode !== null) throw new Error("nats-server exited");
    return portAccepts(port);
  });
  const stop = stopper(child, "nats-server");
  return {
    url: `nats://127.0.0.1:${port}`,
    async stop() {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** `outlive serve` with `config` (an object; listen is set to a free port), ready when /readyz answers 200. */
export async function startReplica(bin, config) {
  const dir = mkdtempSync(join(tmpdir(), "outlive-server-replica-"));
  const port = await freePort();
  const file = join(dir, "outlive.json");
  writeFileSync(file, JSON.stringify({ ...config, listen: `127.0.0.1:${port}` }, null, 2));
  const log = join(dir, "replica.log");
  const { openSync } = await import("node:fs");
  const out = openSync(log, "a");
  const child = spawn(bin, ["serve", "--config", file], { stdio: ["ignore", out, out] });
  const url = `http://127.0.0.1:${port}`;
  await until("the replica answers /readyz 200", 30000, async () => {
    if (child.exitCode !== null) throw new Error(`outlive serve exited ${child.exitCode}:\n${tail(log)}`);
    const r = await fetch(`${url}/readyz`);
    return r.status === 200;
  });
  const stop = stopper(child, "outlive serve");
  return {
    url,
    log: () => tail(log),
    async stop() {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export { mkdirSync };
