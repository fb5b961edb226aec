#!/usr/bin/env python3
"""The daemon-wide bound on NBD request memory (--max-request-memory) and the default
connection limit.

1. bounded: 8 clients each keep 4 WRITEs and 2 READs of 32 MiB in flight on a slow
   export (null driver, 100 ms per request) for 3 rounds, with --max-request-memory 128M.
   Every request succeeds (reads return zeroes), requests had to wait (the daemon logs
   it), and the daemon's peak RSS stays under the bound plus a fixed overhead (not
   checked in the sanitizer build, whose allocator keeps freed memory). Without the bound
   the same load holds 8 x 64 MiB.
2. tiny_bound: --max-request-memory 16M and 4 clients each sending two 64 MiB WRITEs:
   a request larger than the bound gets through alone; nothing fails or hangs.
3. max_connections: by default 256 connections per address are served and the next
   one is refused; once one leaves, a new client is served again.
"""

import os
import socket
import struct
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import (CMD_READ, CMD_WRITE, Closed, Conn, Failure, check,  # noqa: E402
                       expect)
from _nbdserve import Serve, ioplane, run_cases, sanitized  # noqa: E402

K, M = 1 << 10, 1 << 20
OVERHEAD = 64 * M  # binary, iothreads, connection buffers, allocator slack


class Args:
    def __init__(self, sock, timeout=120.0):
        self.socket, self.timeout = sock, timeout


def connect(sock):
    c = Conn(Args(sock))
    c.handshake()
    c.go("n")
    return c


def vm_hwm(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) * K
    raise Failure("no VmHWM for %d" % pid)


def load(sock, rounds, writes, reads, size, errors):
    try:
        c = connect(sock)
        payload = b"\x5a" * size
        zero = bytes(size)
        for r in range(rounds):
            ck = [c.request(CMD_WRITE, i * size, size, 0, payload) for i in range(writes)]
            ck += [c.request(CMD_READ, (writes + i) * size, size) for i in range(reads)]
            for k in ck:
                res = c.wait(k)
                expect(res, [0], "request under memory pressure")
                if res.req[0] == CMD_READ:
                    check(bytes(res.data) == zero, "read returned wrong data")
        c.close()
    except (Failure, Closed, OSError) as e:
        errors.append("%s: %s" % (type(e).__name__, e))


def run_clients(sock, n, **kw):
    errors = []
    threads = [threading.Thread(target=load, args=(sock,), kwargs=dict(kw, errors=errors))
               for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
        check(not t.is_alive(), "a client is stuck")
    check(not errors, "; ".join(errors[:3]))


def serve_null(tmp, extra, latency_ms=100):
    sock = os.path.join(tmp, "s")
    srv = Serve(extra + ["--iothreads", "2", "--image",
                         "n,driver=null,size=4G,read-zeroes=on,latency-ns=%d,mode=timer"
                         % (latency_ms * 1000000),
                         "--nbd", "unix=%s,image=n,writable=on" % sock],
                os.path.join(tmp, "log"))
    return srv, sock


def stop_ok(srv):
    rc = srv.stop()
    check(rc == 0, "exit status %d after SIGTERM\n%s" % (rc, srv.text()[-2000:]))


def case_bounded(tmp):
    bound = 128 * M
    srv, sock = serve_null(tmp, ["--max-request-memory", "128M"])
    try:
        run_clients(sock, 8, rounds=3, writes=4, reads=2, size=32 * M)
        hwm = vm_hwm(srv.pid)
        print("  peak RSS %d MiB with a %d MiB bound" % (hwm >> 20, bound >> 20))
        if not sanitized(ioplane()):
            check(hwm < bound + OVERHEAD, "peak RSS %d MiB > %d MiB bound + %d MiB"
                  % (hwm >> 20, bound >> 20, OVERHEAD >> 20))
        stop_ok(srv)
        check(" waits" in srv.text(), "no request waited:\n" + srv.text()[-2000:])
    finally:
        srv.close()


def case_tiny_bound(tmp):
    srv, sock = serve_null(tmp, ["--max-request-memory", "16M"], latency_ms=20)
    try:
        run_clients(sock, 4, rounds=1, writes=2, reads=0, size=64 * M)
        stop_ok(srv)
    finally:
        srv.close()


def greeted(s):
    s.settimeout(30)
    try:
        return len(s.recv(18)) > 0
    except (ConnectionResetError, socket.timeout):
        return False


def case_max_connections(tmp):
    srv, sock = serve_null(tmp, [])
    conns = []
    try:
        for i in range(256):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            conns.append(s)
            check(greeted(s), "connection %d not served" % (i + 1))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        check(not greeted(s), "connection 257 served: no default limit")
        s.close()
        conns.pop().close()
        ok = False
        for _ in range(100):  # the server notices the close in its own time
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sock)
            ok = greeted(s)
            s.close()
            if ok:
                break
            time.sleep(0.05)
        check(ok, "no client served after one of 256 left")
        check("max-connections=256" in srv.text(), "no log line about the limit")
        for s in conns:
            s.close()
        stop_ok(srv)
    finally:
        for s in conns:
            s.close()
        srv.close()


CASES = [("bounded", case_bounded), ("tiny_bound", case_tiny_bound),
         ("max_connections", case_max_connections)]


def main():
    return run_cases(CASES, (Failure, Closed, OSError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
