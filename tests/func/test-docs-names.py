#!/usr/bin/env python3
"""The docs name only what exists: every `function()`, source file and path that
README.md or docs/*.md puts in backticks, and every relative link, is checked
against the tree. A function counts as existing when src/ or tests/ define or call
it (so a renamed or removed function fails); names of system calls and library
functions that ioplane reaches only through a wrapper are listed in EXTERNAL."""
import os
import re
import sys

SRC = os.environ.get("IOPLANE_SRC") or os.path.join(os.path.dirname(__file__), "..", "..")
SRC = os.path.abspath(SRC)

# Kernel and library entry points the docs name that no ioplane source calls by
# that name (liburing makes the io_uring system calls; the kernel's side of a
# call is what the docs describe).
EXTERNAL = {
    "io_uring_enter", "io_uring_setup", "epoll_wait", "open", "fstat", "recv",
    "sendmsg", "io_submit", "io_getevents", "preadv", "pwritev", "fallocate",
    "fdatasync", "mmap", "munmap", "madvise", "fcntl", "memfd_create", "eventfd",
    "read", "write", "poll", "accept4", "socket", "bind", "listen", "connect",
    "unlink", "close", "ftruncate", "pread", "pwrite", "sched_yield", "splice",
    "clock_gettime", "getrusage", "sigaction", "signalfd", "recvmsg", "send",
}

# Other projects' files the docs compare with.
FOREIGN = {"bdev.h", "bdev_module.h", "docs/interop/vhost-user.rst"}

FUNC = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)\(\)`")
PATH = re.compile(r"`((?:src|tests|bench|docs|scripts|fuzz)/[A-Za-z0-9_./*-]+)`")
FILE = re.compile(r"`([A-Za-z0-9_][A-Za-z0-9_-]*\.(?:c|h|sh|py|md))`")
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")


def docs():
    out = [os.path.join(SRC, "README.md")]
    d = os.path.join(SRC, "docs")
    out += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    return out


def code_text():
    parts, names = [], set()
    for top in ("src", "tests"):
        for root, _, files in os.walk(os.path.join(SRC, top)):
            for f in files:
                names.add(f)
                if f.endswith((".c", ".h")):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        parts.append(fh.read())
    for top in ("bench", "scripts"):
        for root, _, files in os.walk(os.path.join(SRC, top)):
            names.update(files)
    return "\n".join(parts), names


def exists(rel):
    if "*" in rel:
        import glob
        return bool(glob.glob(os.path.join(SRC, rel)))
    return os.path.exists(os.path.join(SRC, rel.rstrip("/")))


def main():
    text, names = code_text()
    known = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", text))
    known |= set(re.findall(r"#define\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    bad, checked = [], 0
    for doc in docs():
        rel = os.path.relpath(doc, SRC)
        with open(doc) as fh:
            body = fh.read()
        for n, line in enumerate(body.splitlines(), 1):
            where = f"{rel}:{n}"
            for fn in FUNC.findall(line):
                checked += 1
                if fn not in known and fn not in EXTERNAL:
                    bad.append(f"{where}: function {fn}() is not in src/ or tests/")
            for p in PATH.findall(line):
                if "NAME" in p or p in FOREIGN:  # a placeholder, or another project's
                    continue
                checked += 1
                if not exists(p):
                    bad.append(f"{where}: path {p} does not exist")
            for f in FILE.findall(line):
                if f in FOREIGN:
                    continue
                checked += 1
                if f not in names:
                    bad.append(f"{where}: file {f} is not in the tree")
            for link in LINK.findall(line):
                checked += 1
                target = os.path.normpath(os.path.join(os.path.dirname(doc), link))
                if not os.path.exists(target):
                    bad.append(f"{where}: link {link} leads nowhere")
    for b in bad:
        print(b)
    print(f"{checked} names checked in {len(docs())} documents, {len(bad)} missing")
    if checked < 50:
        print("too few names found: the patterns no longer match the docs")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
