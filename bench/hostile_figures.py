#!/usr/bin/env python3
"""hostile_figures: the findings of issue 34 measured against real `outlive serve` builds.

For each build given (LABEL=PATH to an `outlive` binary), on one PostgreSQL 15 and one
nats-server this script starts (as the tests' harness does), each probe runs against a fresh
`outlive serve` of that build on its own migrated database. Prints one JSON object per probe and
build, then a Markdown table (docs/BENCHMARKS.md, "Hostile input: before and after").

  python3 bench/hostile_figures.py old=/work/wt-hostile-old/build/src/app/outlive new=build/src/app/outlive
  python3 bench/hostile_figures.py --only pieces,utf8 new=build/src/app/outlive

Plain sockets throughout: a client library would not send these bytes. Every wait has a deadline.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

PG_BIN = "/usr/lib/postgresql/15/bin"
SCHEMA = """
CREATE SCHEMA auth;
CREATE TABLE auth.sessions (token_sha256 text PRIMARY KEY, subject text, actor text, app_session boolean, expires_at timestamptz);
CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject text, actor text, scopes text[], revoked_at timestamptz);
CREATE TABLE auth.oauth_tokens (token_sha256 text PRIMARY KEY, subject text, actor text, scopes text[], expires_at timestamptz);
CREATE SCHEMA inventory;
CREATE TABLE inventory.warehouses (id uuid PRIMARY KEY, public_id text UNIQUE);
CREATE TABLE inventory.members (warehouse_id uuid, subject text);
INSERT INTO inventory.warehouses VALUES ('00000000-0000-0000-0000-00000000000a', 'north');
INSERT INTO inventory.members SELECT '00000000-0000-0000-0000-00000000000a', 'user:t' || i FROM generate_series(0, 20) i;
INSERT INTO auth.sessions SELECT encode(sha256(('tab-' || i)::bytea), 'hex'), 'user:t' || i, 'user:t' || i, false, now() + interval '1 hour' FROM generate_series(0, 20) i;
"""
NORTH = "00000000-0000-0000-0000-00000000000a"
COOKIE = "Cookie: session=tab-0\r\n"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(condition, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


class Postgres:
    def __init__(self, root):
        self.dir = os.path.join(root, "pg")
        os.makedirs(self.dir)
        shutil.chown(self.dir, "postgres", "postgres")
        data = os.path.join(self.dir, "data")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(as_pg + [PG_BIN + "/initdb", "-D", data, "-U", "postgres", "-A", "trust",
                                "-E", "UTF8", "--locale=C", "--no-sync"],
                       check=True, capture_output=True)
        self.port = free_port()
        self.proc = subprocess.Popen(
            as_pg + [PG_BIN + "/postgres", "-D", data, "-p", str(self.port), "-k", self.dir,
                     "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                     "-c", "max_connections=300"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(root, "pg.log"), "w"))
        assert wait_for(lambda: self.sql("postgres", "SELECT 1")[0] == 0, 30, 0.2)

    def url(self, db):
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, db, statements, user="postgres"):
        r = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h",
                            "127.0.0.1", "-p", str(self.port), "-U", user, "-d", db, "-c",
                            statements], capture_output=True, text=True)
        return r.returncode, r.stdout.strip(), r.stderr.strip()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)


class Nats:
    def __init__(self, root):
        self.port = free_port()
        self.store = os.path.join(root, "nats")
        self.log = os.path.join(root, "nats.log")
        self.proc = None
        self.start()

    def url(self):
        return f"nats://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.store],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "a"))
        assert wait_for(self.listening, 20)

    def listening(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(20)


def http_get(port, target, timeout=15):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{target}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception:
        return 0, ""


class Serve:
    """One `outlive serve` of a build on its own migrated database."""
    count = 0

    def __init__(self, env, binary, name="r1", db=None):
        Serve.count += 1
        self.env = env
        if db is None:
            db = f"h{Serve.count}"
            assert env.pg.sql("postgres", f"CREATE DATABASE {db}")[0] == 0
            r = subprocess.run([binary, "migrate", "--database", env.pg.url(db)],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert env.pg.sql(db, SCHEMA)[0] == 0
        self.db = db
        self.port = free_port()
        warehouse = {
            "scope": {"type": "object", "properties": {"warehouse": {"type": "string"}},
                      "required": ["warehouse"], "additionalProperties": False},
            "keys": "SELECT id::text AS key FROM inventory.warehouses "
                    "WHERE public_id = $1->>'warehouse'",
            "authorize": "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN "
                         "inventory.members m ON m.warehouse_id = $1::uuid AND "
                         "m.subject = v->>'accessSubject'"}
        config = {
            "replica": name, "listen": f"127.0.0.1:{self.port}", "database": env.pg.url(db),
            "nats": [env.nats.url()], "publisher": {"poll_ms": 100},
            "auth": {
                "session_cookie": "session", "recheck_seconds": 60,
                "sessions": "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM "
                            "auth.sessions WHERE token_sha256 = $1 AND expires_at > now()",
                "api_keys": "SELECT subject, actor, scopes, false AS app_session FROM "
                            "auth.api_keys WHERE key_sha256 = $1 AND revoked_at IS NULL",
                "oauth_tokens": "SELECT subject, actor, scopes, false AS app_session FROM "
                                "auth.oauth_tokens WHERE token_sha256 = $1 AND "
                                "expires_at > now()"},
            "apps": {"inventory": {"allowed_origins": ["http://localhost:8080"],
                                   "channels": {"warehouse": warehouse}}}}
        path = os.path.join(env.root, f"serve{Serve.count}.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.log = os.path.join(env.root, f"serve{Serve.count}.log")
        self.proc = subprocess.Popen([binary, "serve", "--config", path],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        assert wait_for(lambda: http_get(self.port, "/readyz", 1)[0] == 200, 30), self.log

    def publish(self, n=1, key=NORTH):
        return self.env.pg.sql(self.db, "SELECT count(events.publish_live('inventory', "
                               f"'{key}', jsonb_build_object('n', i))) FROM generate_series(1, {n}) i;"
                               " SELECT events.wake('inventory')")

    def status(self, field):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    def rss_mib(self):
        return round(self.status("VmRSS") / 2**20, 1)

    def fds(self):
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return -1

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM):
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def client_frame(opcode, payload, fin=True):
    payload = payload.encode() if isinstance(payload, str) else payload
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n <= 0xFFFF:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    key = b"\x12\x34\x56\x78"
    return head + key + bytes(b ^ key[i & 3] for i, b in enumerate(payload))


class Raw:
    """A websocket over a plain socket; `early` bytes go out in the upgrade request's write."""

    opened = 0

    def __init__(self, port, target="/api/inventory/live", headers=None, early=b""):
        if headers is None:  # a person of their own per socket: 5 opens a second per person
            Raw.opened += 1
            headers = f"Cookie: session=tab-{Raw.opened % 21}\r\n"
        self.sock = socket.create_connection(("127.0.0.1", port), 10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = (f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   f"Sec-WebSocket-Version: 13\r\n{headers}\r\n").encode("latin-1")
        self.sock.sendall(request + early)
        self.buf = b""
        self.eof = False
        deadline = time.monotonic() + 10
        while b"\r\n\r\n" not in self.buf:
            if not self.fill(deadline):
                raise RuntimeError("no upgrade response")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise RuntimeError("upgrade refused: " + head.decode("latin-1")[:80])

    def fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0 or self.eof:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except (socket.timeout, BlockingIOError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def send(self, data):
        self.sock.sendall(data)

    def send_in_pieces(self, data, piece, gap):
        for at in range(0, len(data), piece):
            self.sock.sendall(data[at:at + piece])
            if gap:
                time.sleep(gap)

    def next(self, timeout=3.0):
        deadline = time.monotonic() + timeout
        while True:
            n, header = (self.buf[1] & 0x7F, 2) if len(self.buf) >= 2 else (0, 0)
            if n == 126:
                n, header = (struct.unpack("!H", self.buf[2:4])[0], 4) if len(self.buf) >= 4 \
                    else (0, 0)
            elif n == 127:
                n, header = (struct.unpack("!Q", self.buf[2:10])[0], 10) if len(self.buf) >= 10 \
                    else (0, 0)
            if header and len(self.buf) >= header + n:
                frame = (self.buf[0] & 0x0F, self.buf[header:header + n])
                self.buf = self.buf[header + n:]
                return frame
            if not self.fill(deadline):
                return None

    def next_json(self, kind, timeout=3.0):
        deadline = time.monotonic() + timeout
        while True:
            f = self.next(max(0.0, deadline - time.monotonic()))
            if f is None:
                return None
            if f[0] == 0x8:
                return {"type": "<close>", "code": struct.unpack("!H", f[1][:2])[0] if len(f[1]) >= 2 else 1005}
            if f[0] == 0x1:
                try:
                    j = json.loads(f[1])
                except ValueError:
                    continue
                if j.get("type") == kind:
                    return j

    def close_code(self, timeout=3.0):
        deadline = time.monotonic() + timeout
        while True:
            f = self.next(max(0.0, deadline - time.monotonic()))
            if f is None:
                return 0
            if f[0] == 0x8:
                return struct.unpack("!H", f[1][:2])[0] if len(f[1]) >= 2 else 1005

    def reset(self):
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def sub_text(sid, padded_to=0, cursor=None):
    m = {"channel": "warehouse", "id": sid, "scope": {"warehouse": "north"}, "type": "sub"}
    if cursor:
        m["cursor"] = cursor
    text = json.dumps(m, separators=(",", ":"), sort_keys=True)
    if padded_to > len(text):
        text = text[:1] + " " * (padded_to - len(text)) + text[1:]
    return text


def answered(ws, kind, sid=None, timeout=3.0):
    start = time.monotonic()
    j = ws.next_json(kind, timeout)
    if j is None:
        return f"no {kind} in {timeout:g} s"
    if j["type"] == "<close>":
        return f"closed {j['code']}"
    if sid is not None and j.get("id") != sid:
        return f"{kind} for {j.get('id')}"
    return f"{kind} in {1000 * (time.monotonic() - start):.0f} ms"


# --- probes ---------------------------------------------------------------------------------


def probe_pieces(env, binary):
    s = Serve(env, binary)
    out = {}
    ws = Raw(s.port)
    text = sub_text("a").encode()
    ws.send_in_pieces(client_frame(1, text[:len(text) // 2], False), 1 << 20, 0.02)
    ws.send(client_frame(0, text[len(text) // 2:], True))
    out["2 fragments, 20 ms apart"] = answered(ws, "subscribed", "a")
    ws = Raw(s.port)
    text = sub_text("b", 16000).encode()
    sizes, at, i = [64, 4096, 100, 1000, 3000, 64, 2048], 0, 0
    while at < len(text):
        n = min(sizes[i % 7], len(text) - at)
        ws.send_in_pieces(client_frame(1 if at == 0 else 0, text[at:at + n], at + n == len(text)),
                          1 << 20, 0.002)
        at, i = at + n, i + 1
    out["16 KiB in fragments of 64-4,096 B"] = answered(ws, "subscribed", "b")
    ws = Raw(s.port)
    ws.send_in_pieces(client_frame(1, sub_text("c", 16000)), 64, 0.0001)
    out["16 KiB frame in 64 B writes"] = answered(ws, "subscribed", "c")
    ws = Raw(s.port)
    ws.send(b"".join(client_frame(1, sub_text(x)) for x in "def"))
    out["3 subs in one write"] = ";".join(answered(ws, "subscribed", x) for x in "def")
    ws = Raw(s.port)
    ws.send(b"".join(client_frame(1, t) for t in
                     [b"\x7f", b"\xed\x9f\xbf", b"\xef\xbf\xbe", b"\xef\xbf\xbf"]))
    got = [answered(ws, "error") for _ in range(4)]
    out["4 short non-JSON texts in one write"] = f"{sum('error in' in g for g in got)} of 4 answered"
    # Shapes beyond the test's: the sub in the upgrade request's own write, one byte a write.
    ws = Raw(s.port, early=client_frame(1, sub_text("g")))
    out["sub in the upgrade request's write"] = answered(ws, "subscribed", "g")
    ws = Raw(s.port)
    ws.send_in_pieces(client_frame(1, sub_text("h")), 1, 0.0005)
    out["sub in 1 B writes"] = answered(ws, "subscribed", "h")
    ws = Raw(s.port)
    text = sub_text("i").encode()
    ws.send(client_frame(1, text[:10], False) + client_frame(0, text[10:], True))
    out["2 fragments in one write"] = answered(ws, "subscribed", "i")
    s.stop()
    return out


def probe_ff_target(env, binary):
    s = Serve(env, binary)
    ws = Raw(s.port)
    ws.send(client_frame(1, sub_text("w")))
    first = answered(ws, "subscribed", "w")
    c = socket.create_connection(("127.0.0.1", s.port), 5)
    c.sendall(b"GET /api/\xff/live/cursor HTTP/1.1\r\nHost: x\r\n\r\n")
    c.settimeout(5)
    try:
        status = c.recv(4096).split(b"\r\n")[0].decode("latin-1") or "connection closed"
    except OSError as e:
        status = f"connection error ({e.__class__.__name__})"
    time.sleep(0.5)
    alive = s.alive()
    out = {"answer": status, "replica": "alive" if alive else f"exited {s.proc.returncode}",
           "healthz": http_get(s.port, "/healthz", 2)[0], "open socket": first}
    if alive:
        s.publish()
        out["open socket after"] = answered(ws, "update")
    else:
        out["open socket after"] = f"closed (code {ws.close_code(1) or 'none: 1006'})"
    s.stop()
    return out


def probe_reply_flood(env, binary, frames=2_000_000, seconds=20):
    s = Serve(env, binary)
    ws = Raw(s.port)
    before = s.rss_mib()
    batch = client_frame(1, b"{") * 10000
    ws.sock.setblocking(False)
    sent, offset, blocked_since = 0, 0, time.monotonic()
    start = time.monotonic()
    peak, sampled = before, start
    while sent < frames and time.monotonic() - start < seconds:
        if time.monotonic() - sampled >= 0.25:
            peak, sampled = max(peak, s.rss_mib()), time.monotonic()
        try:
            n = ws.sock.send(batch[offset:])
            offset += n
            sent += offset // 7 - (offset - n) // 7
            if offset == len(batch):
                offset = 0
            blocked_since = time.monotonic()
        except BlockingIOError:
            if time.monotonic() - blocked_since >= 2:
                break
            time.sleep(0.01)
    elapsed = time.monotonic() - start
    peak = max(peak, s.rss_mib())
    out = {"frames written": sent, "seconds": round(elapsed, 1),
           "reading stopped": time.monotonic() - blocked_since >= 2,
           "rss MiB": f"{before} -> {peak}"}
    s.stop()
    return out


def probe_junk_opens(env, binary, count=50_000, threads=16):
    s = Serve(env, binary)
    codes, lock, nxt = {}, threading.Lock(), iter(range(count))

    def work():
        mine = {}
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                break
            address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
            try:
                ws = Raw(s.port, headers=f"X-Forwarded-For: {address}\r\n"
                                         f"Authorization: Bearer junk-{i}\r\n")
                e = ws.next_json("error", 10)
                code = e.get("code") if e else "<none>"
                ws.reset()
            except Exception as ex:
                code = f"<{ex.__class__.__name__}>"
            mine[code] = mine.get(code, 0) + 1
        with lock:
            for k, v in mine.items():
                codes[k] = codes.get(k, 0) + v

    before = s.rss_mib()
    start = time.monotonic()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - start
    after = s.rss_mib()
    time.sleep(5)
    later = s.rss_mib()
    s.stop()
    return {"opens": count, "seconds": round(elapsed, 1), "codes": codes,
            "rss MiB": f"{before} -> {after} -> {later} (5 s later)"}


def probe_cursor_flood(env, binary):
    s = Serve(env, binary)
    s.publish()
    assert wait_for(lambda: http_get(s.port, "/api/inventory/live/cursor", 2)[0] == 200, 10)
    ws0 = Raw(s.port)
    start = time.monotonic()
    ws0.send(client_frame(1, sub_text("calm")))
    calm = answered(ws0, "subscribed", "calm", 10)
    os.kill(env.nats.proc.pid, signal.SIGSTOP)
    try:
        def one():
            t = time.monotonic()
            return http_get(s.port, "/api/inventory/live/cursor", 20)[0], time.monotonic() - t
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            futures = [pool.submit(one) for _ in range(64)]
            time.sleep(0.2)
            ws = Raw(s.port)
            ws.send(client_frame(1, sub_text("w")))
            during = answered(ws, "subscribed", "w", 15)
            results = [f.result() for f in futures]
    finally:
        os.kill(env.nats.proc.pid, signal.SIGCONT)
    statuses = {}
    for st, _ in results:
        statuses[st] = statuses.get(st, 0) + 1
    s.stop()
    return {"sub without the flood": calm, "sub during 64 cursor requests, NATS stopped": during,
            "cursor answers": statuses,
            "slowest cursor s": round(max(t for _, t in results), 1)}


def probe_closes(env, binary, count=3000):
    s = Serve(env, binary)
    before = s.fds()
    sockets, codes = [], {}
    for _ in range(count):
        ws = Raw(s.port, target="/api/nope/live", headers="")
        c = ws.close_code(5)
        codes[c] = codes.get(c, 0) + 1
        sockets.append(ws)
    held = s.fds()
    time.sleep(6)
    later = s.fds()
    ended = 0
    for ws in sockets:
        ws.sock.setblocking(False)
        try:
            if ws.sock.recv(65536) == b"":
                ended += 1
        except BlockingIOError:
            pass
        except OSError:
            ended += 1
        ws.sock.close()
    s.stop()
    return {"close codes": codes, "descriptors": f"{before} -> {held} -> {later} (6 s later)",
            "connections the replica ended": ended}


def probe_utf8(env, binary):
    s = Serve(env, binary)
    ws = Raw(s.port)
    payload = bytearray(b"a" * 16000)
    payload[10] = 0xFF
    frame = client_frame(1, bytes(payload))
    ws.send(frame[:8 + 11])
    start = time.monotonic()
    code = ws.close_code(3)
    if code:
        out = {"close": f"{code} {1000 * (time.monotonic() - start):.0f} ms after the byte"}
    else:
        ws.send(frame[8 + 11:])
        t = time.monotonic()
        code = ws.close_code(3)
        out = {"close": f"none within 3 s of the byte; {code} "
                        f"{1000 * (time.monotonic() - t):.0f} ms after the frame ended"}
    s.stop()
    return out


def probe_nats_down(env, binary):
    s = Serve(env, binary)
    s.publish()
    assert wait_for(lambda: http_get(s.port, "/api/inventory/live/cursor", 2)[0] == 200, 10)
    cursor = json.loads(http_get(s.port, "/api/inventory/live/cursor")[1])["cursor"]
    env.nats.stop()
    out = {}
    try:
        s.publish(200)
        for label, c in (("sub", None), ("sub with a cursor", cursor)):
            ws = Raw(s.port)
            ws.send(client_frame(1, sub_text("w", cursor=c)))
            j = ws.next_json("subscribed", 12)
            if j is None:
                j = ws.next_json("resync", 0.1)
            out[label] = "no answer in 12 s" if j is None else (
                f"closed {j['code']}" if j["type"] == "<close>" else j["type"])
    finally:
        env.nats.start()
    s.stop()
    return out


def probe_failover(env, binary, tabs=20):
    r1 = Serve(env, binary, "r1")
    r2 = Serve(env, binary, "r2", db=r1.db)
    cursors, sockets = [], []
    for i in range(tabs):
        ws = Raw(r1.port, headers=f"Cookie: session=tab-{i + 1}\r\n")
        ws.send(client_frame(1, sub_text("w")))
        assert ws.next_json("subscribed", 10)
        sockets.append(ws)
    r1.publish(10)
    for ws in sockets:
        cur = None
        for _ in range(10):
            u = ws.next_json("update", 10)
            cur = u["cursor"] if u and "cursor" in u else cur
        cursors.append(cur)
    r1.stop(signal.SIGKILL)
    r1.publish(20)
    outcome = {}
    for i, cur in enumerate(cursors):
        ws = Raw(r2.port, headers=f"Cookie: session=tab-{i + 1}\r\n")
        ws.send(client_frame(1, sub_text("w", cursor=cur)))
        j = ws.next_json("subscribed", 12)
        if j is None or j["type"] == "<close>":
            key = "no answer" if j is None else f"closed {j['code']}"
        else:
            got = [ws.next_json("update", 10) for _ in range(20)]
            ns = [u["data"]["n"] for u in got if u and u.get("type") == "update"]
            key = "subscribed, 20 updates in order" if ns == list(range(1, 21)) else \
                f"subscribed, updates {ns[:3]}..{ns[-3:]} ({len(ns)})"
        outcome[key] = outcome.get(key, 0) + 1
    r2.stop()
    return {"tabs": outcome}


def probe_cross_app(env, binary):
    s = Serve(env, binary)
    s.stop()
    pg, db = env.pg, s.db
    role = "inv_writer"
    pg.sql(db, f"CREATE ROLE {role} LOGIN")
    has_grant = pg.sql(db, "SELECT to_regprocedure('events.grant_writer(name, text)') IS NOT NULL")[1]
    if has_grant == "t":
        setup = pg.sql(db, f"SELECT events.grant_writer('{role}', 'inventory')")
        how = "events.grant_writer (docs/WRITERS.md)"
    else:
        setup = pg.sql(db, f"GRANT USAGE ON SCHEMA events TO {role}; "
                           f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA events TO {role}; "
                           f"GRANT SELECT, INSERT ON events.outbox TO {role}; "
                           f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA events TO {role}")
        how = "USAGE, EXECUTE, SELECT+INSERT on the outbox, USAGE on its sequence"

    def verdict(r):
        return "accepted" if r[0] == 0 else "refused: " + r[2].split("\n")[0][:90]

    return {
        "grants": how + ("" if setup[0] == 0 else " FAILED " + setup[2]),
        "own app": verdict(pg.sql(db, "SELECT events.publish_live('inventory', 'k', '{}')", role)),
        "publish_live('billing')": verdict(
            pg.sql(db, "SELECT events.publish_live('billing', 'k', '{}')", role)),
        "INSERT of a billing row": verdict(pg.sql(
            db, "INSERT INTO events.outbox (id, app_id, topic, key, envelope) VALUES "
                "(gen_random_uuid(), 'billing', 'cloud:live:billing', 'k', '{}')", role)),
        "300 KB envelope (own app)": verdict(pg.sql(
            db, "SELECT events.publish_live('inventory', 'k', jsonb_build_object('d', repeat('x', 300000)))",
            role)),
    }


PROBES = {"pieces": probe_pieces, "ff": probe_ff_target, "flood": probe_reply_flood,
          "junk": probe_junk_opens, "cursor": probe_cursor_flood, "closes": probe_closes,
          "utf8": probe_utf8, "natsdown": probe_nats_down, "failover": probe_failover,
          "crossapp": probe_cross_app}


class Env:
    def __init__(self, root):
        self.root = root
        self.pg = Postgres(root)
        self.nats = Nats(root)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+", help="LABEL=PATH of an outlive binary")
    ap.add_argument("--only", default=",".join(PROBES))
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    root = tempfile.mkdtemp(prefix="hostile-figures-")
    os.chmod(root, 0o755)
    env = Env(root)
    results = {}
    try:
        for name in args.only.split(","):
            for label, binary in builds:
                try:
                    r = PROBES[name](env, os.path.abspath(binary))
                except Exception as e:  # a probe's failure is a figure too
                    r = {"error": f"{e.__class__.__name__}: {e}"}
                results[(name, label)] = r
                print(json.dumps({"probe": name, "build": label, **r}), flush=True)
    finally:
        env.nats.stop()
        env.pg.stop()
    print(f"\nlogs in {root}\n\n| probe | " + " | ".join(l for l, _ in builds) + " |")
    print("|---|" + "---|" * len(builds))
    for name in args.only.split(","):
        keys = []
        for label, _ in builds:
            keys += [k for k in results[(name, label)] if k not in keys]
        for k in keys:
            cells = [str(results[(name, label)].get(k, "")) for label, _ in builds]
            print(f"| {name}: {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
