#!/usr/bin/env python3
"""The include boundaries of src/ (issue 37): fails when a file includes a header of a folder its
own folder may not depend on, includes an outside library (an angle include) outside the folders
that library is confined to, or sits in a folder the table does not list. The tables are the
"may include" column of docs/ARCHITECTURE.md; a folder may always include its own headers.

  check-includes.py SRC_DIR     check the tree (ctest arch:includes)
  check-includes.py --self-test show that a crossing is caught (ctest arch:includes-self-test)
"""
import os
import re
import sys
import tempfile

# folder -> the folders (or single headers, "folder/file.hpp") it may include. Lower layers first.
ALLOWED = {
    "common": [],
    "schema": ["common"],
    "metrics": ["common"],
    "db": ["common"],
    "topic": ["common"],
    "config": ["common", "schema", "topic"],
    "outbox": ["common", "db", "schema", "topic"],
    "window": ["common", "topic"],
    "publisher": ["common", "outbox", "topic"],
    "auth": ["common", "config", "db", "outbox"],
    "http_client": ["common"],  # every outgoing HTTP call (JWKS, hooks)
    "jwt": ["common", "config", "metrics", "auth", "http_client"],
    "hooks": ["common", "config", "metrics", "http_client"],
    "access": ["common", "config", "db"],
    "tab": ["common"],  # the tab protocol: messages and frames, whatever the transport
    "ws": ["common"],  # the transport: knows nothing of sessions, topics or the tab protocol
    "admission": ["common", "auth", "ws/limits.hpp"],
    "fanout": ["common", "config", "topic", "window", "access", "tab"],
    "session": ["common", "config", "schema", "db", "metrics", "topic", "window", "auth", "access",
                "admission", "fanout", "tab", "ws", "jwt"],
    # Server-Sent Events (SPEC 5.9): a transport of the session's, which it knows by its interface
    "sse": ["common", "ws", "session/transport.hpp"],
    "http": ["common", "config", "db", "metrics", "window", "ws", "session", "sse"],
    "harness": ["common"],
    "replica": ["common", "config", "schema", "db", "metrics", "topic", "outbox", "window",
                "publisher", "auth", "fanout", "session", "http", "ws", "jwt", "hooks"],
    "app": ["common", "config", "topic", "outbox", "harness", "replica", "jwt", "hooks", "http_client"],
}

# Outside libraries confined to some folders: the start of an angle include -> the folders that
# may include it. The longest matching start counts; what no start matches (the standard library,
# POSIX, nlohmann-json, the public outlive/ headers) any folder may include.
LIBRARIES = {
    "pqxx/": ["db", "outbox", "auth"],  # libpqxx: the typed queries and tasks of db/ for the rest
    "libpq-fe.h": ["harness", "app"],  # libpq: the embedded server's readiness, `outlive check`
    "nats/": ["topic"],
    "boost/beast": ["http", "http_client", "hooks", "jwt"],  # http_client: outgoing calls; hooks, jwt: their requests
    "boost/asio": ["ws", "sse", "http", "session", "access", "http_client"],  # access: the code channels' threads
    "boost/container/": ["fanout", "session"],  # session: a socket's subscriptions (KeyMap)
    "valijson/": ["schema"],
    "prometheus/": ["metrics"],
    "openssl/": ["auth", "jwt", "http_client", "hooks"],  # jwt: EVP signatures, TLS to the JWKS endpoint
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
ANGLE_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)


def library_of(header):
    starts = [start for start in LIBRARIES if header.startswith(start)]
    return max(starts, key=len) if starts else None


def crossings(src):
    found = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".hpp", ".cpp", ".h")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            folder = rel.split(os.sep)[0]
            if folder == rel:  # a file at the top of src/
                continue
            if folder not in ALLOWED:
                found.append(f"{rel}: folder {folder}/ is not in the table of scripts/check-includes.py")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for header in INCLUDE.findall(text):
                target = header.split("/")[0]
                if "/" not in header or target == folder or target not in ALLOWED:
                    continue  # its own, a local header, or not one of ours (outlive/..., etc.)
                allowed = ALLOWED[folder]
                if target in allowed or header in allowed:
                    continue
                found.append(f"{rel}: includes {header} ({folder}/ may not depend on {target}/)")
            for header in ANGLE_INCLUDE.findall(text):
                library = library_of(header)
                if library is None or folder in LIBRARIES[library]:
                    continue
                found.append(f"{rel}: includes <{header}> ({library} is confined to "
                             f"{', '.join(f + '/' for f in LIBRARIES[library])})")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("session/a.hpp", '#include "ws/connection.hpp"\n#include "session/b.hpp"\n')
        write("fanout/b.cpp", '#include "tab/protocol.hpp"\n#include <boost/container/small_vector.hpp>\n')
        write("db/f.cpp", "#include <pqxx/pqxx>\n#include <vector>\n")
        write("session/g.cpp", "#include <boost/asio.hpp>\n#include <nlohmann/json.hpp>\n")
        write("http/h.cpp", "#include <boost/beast/core.hpp>\n")
        if crossings(tmp):
            print("self-test: allowed includes were reported:", crossings(tmp))
            return 1
        write("ws/c.cpp", '#include "session/session.hpp"\n')  # the transport up to the protocol
        write("fanout/d.cpp", '#include "ws/connection.hpp"\n')  # the transport below delivery
        write("newfolder/e.cpp", "\n")
        # Outside libraries beyond their folders: libpqxx in the protocol, nats.c and Beast in
        # the transport.
        write("session/i.cpp", "#include <pqxx/connection>\n")
        write("access/j.hpp", "  #  include <pqxx/pqxx>\n")
        write("ws/k.cpp", "#include <nats/nats.h>\n#include <boost/beast/websocket.hpp>\n")
        found = crossings(tmp)
        if len(found) != 7 or sum("pqxx/ is confined" in f for f in found) != 2:
            print("self-test: expected 7 crossings (2 of libpqxx), found:", found)
            return 1
    print("self-test: crossings are caught")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    found = crossings(sys.argv[1])
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) across a boundary: fix them, or change the tables in "
              "scripts/check-includes.py together with docs/ARCHITECTURE.md")
        return 1
    print("include boundaries hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
