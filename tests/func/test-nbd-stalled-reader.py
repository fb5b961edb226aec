#!/usr/bin/env python3
"""An NBD client that stops reading its replies holds up nobody else.

One iothread serves two clients. The first sends 48 READs of 1 MiB and reads nothing, so
its socket fills and the daemon's reply sends come back short or with EAGAIN. The second
client, on the same iothread, then does 200 reads of 4 KiB and a write each of which must
be answered within 20 seconds. Then the first client reads its replies: all 48, each 1 MiB
of zeroes, none lost or garbled by the sends that had to wait, none later than 20 seconds
after the one before; the same without the second client, where the daemon hears of the
room the client makes from nothing but the socket. Run with the default
loop (which sends replies in the io_uring_enter that waits, where a send that could wait
would stall the whole loop), with IOPLANE_RING_PLAIN=1 and under the epoll loop.
"""

import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import CMD_READ, Closed, Conn, Failure, check, expect  # noqa: E402
from _nbdserve import Serve, run_cases  # noqa: E402

M = 1 << 20
BIG, NBIG = 1 * M, 48


class Args:
    def __init__(self, sock, timeout=120.0):
        self.socket, self.timeout = sock, timeout


def connect(sock, timeout=None):
    c = Conn(Args(sock), timeout)
    c.handshake()
    c.go("n")
    return c


def stalled(tmp, env, other=True):
    sock = os.path.join(tmp, "s")
    srv = Serve(["--iothreads", "1", "--image", "n,driver=null,size=1G,read-zeroes=on",
                 "--nbd", "unix=%s,image=n,writable=on" % sock],
                os.path.join(tmp, "log"), env=env)
    try:
        a = connect(sock)
        cookies = [a.request(CMD_READ, i * BIG, BIG) for i in range(NBIG)]
        time.sleep(0.5)  # the daemon fills a's socket meanwhile
        if other:
            b = connect(sock, timeout=20.0)
            for i in range(200):
                res = b.read(i * 4096, 4096)
                expect(res, [0], "read %d of the second client" % i)
                check(bytes(res.data) == bytes(4096), "second client: wrong data")
            expect(b.write(0, b"\x5a" * 4096), [0], "write of the second client")
            b.close()
        a.timeout = 20.0
        a.s.settimeout(20.0)
        zero = bytes(BIG)
        for k in cookies:
            res = a.wait(k)
            expect(res, [0], "stalled client's read")
            check(bytes(res.data) == zero, "stalled client: wrong data")
        a.close()
    finally:
        rc = srv.stop()
    check(rc == 0, "exit status %d after SIGTERM\n%s" % (rc, srv.text()[-2000:]))


CASES = [
    ("default", lambda tmp: stalled(tmp, {})),
    ("default-alone", lambda tmp: stalled(tmp, {}, other=False)),
    ("plain", lambda tmp: stalled(tmp, {"IOPLANE_RING_PLAIN": "1"})),
    ("epoll", lambda tmp: stalled(tmp, {"IOPLANE_LOOP_BACKEND": "epoll"})),
]


def main():
    return run_cases(CASES, (Failure, Closed, OSError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
