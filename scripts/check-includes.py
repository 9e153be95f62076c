#!/usr/bin/env python3
"""The include boundaries of src/ (issue 37): fails when a file includes a header of a folder its
own folder may not depend on, or sits in a folder the table does not list. The table is the
"depends on" column of docs/ARCHITECTURE.md; a folder may always include its own headers.

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
    "access": ["common", "config", "db"],
    "ws": ["common"],  # the transport: knows nothing of sessions or topics
    "admission": ["common", "auth", "ws/limits.hpp"],
    "fanout": ["common", "config", "topic", "window", "access", "ws/protocol.hpp"],
    "session": ["common", "config", "schema", "db", "metrics", "topic", "window", "auth", "access",
                "admission", "fanout", "ws"],
    "http": ["common", "config", "db", "metrics", "window", "ws", "session"],
    "harness": ["common"],
    "replica": ["common", "config", "schema", "db", "metrics", "topic", "outbox", "window",
                "publisher", "auth", "fanout", "session", "http", "ws"],
    "app": ["common", "config", "topic", "outbox", "harness", "replica"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


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
    return found


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("session/a.hpp", '#include "ws/connection.hpp"\n#include "session/b.hpp"\n')
        write("fanout/b.cpp", '#include "ws/protocol.hpp"\n')
        if crossings(tmp):
            print("self-test: allowed includes were reported:", crossings(tmp))
            return 1
        write("ws/c.cpp", '#include "session/session.hpp"\n')  # the transport up to the protocol
        write("fanout/d.cpp", '#include "ws/connection.hpp"\n')  # beyond the one header allowed
        write("newfolder/e.cpp", "\n")
        found = crossings(tmp)
        if len(found) != 3:
            print("self-test: expected 3 crossings, found:", found)
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
        print(f"{len(found)} include(s) across a boundary: fix them, or change the table in "
              "scripts/check-includes.py together with docs/ARCHITECTURE.md")
        return 1
    print("include boundaries hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
