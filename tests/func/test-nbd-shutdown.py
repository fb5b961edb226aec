#!/usr/bin/env python3
"""SIGTERM with NBD connections in every state: the daemon exits 0, never touches freed
memory (run under ASan by the test runner), and leaves every image flushed and clean.

Each case starts its own daemon, puts one or more raw-protocol clients (_nbdproto.Conn)
into a state, sends SIGTERM and checks what each client sees, the exit status, and the
image contents (qcow2 images: `qemu-img check` clean and the dirty bit clear):
  mid_payload_*     a WRITE whose payload is half sent: the first request, after a FUA
                    write (nothing to flush), after a plain write; raw and qcow2
  skipping          the payload of a refused WRITE being read and dropped
  in_flight         32 requests in the block layer (null driver, 300 ms latency): each
                    gets its reply, then the connection closes
  reply_disconnect  a client resets its socket while the server is sending replies
  handshake         connections before the greeting is read, after the client flags, in
                    the middle of an option, and idle in transmission
  second_signal     a client that stops reading replies; a second SIGTERM drops it
  drain_timeout     the same client with one SIGTERM: dropped after the drain timeout
  signal_in_teardown  a second SIGTERM while the images are being flushed
  all_at_once       all of these together on two iothreads
"""

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import *             # noqa: E402,F403
from _nbdserve import Serve, run_cases  # noqa: E402

K, M = 1 << 10, 1 << 20


class Args:
    def __init__(self, sock, timeout=30.0):
        self.socket, self.timeout = sock, timeout


def connect(sock, export, timeout=30.0):
    c = Conn(Args(sock, timeout))
    c.handshake()
    c.go(export)
    return c


def pattern(byte, n):
    return bytes([byte]) * n


def file_bytes(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def qemu_img_read(img, fmt, off, n):
    """Guest bytes of an image through qemu-img (qcow2 contents, not the file)."""
    out = os.path.join(os.path.dirname(img), "dump.raw")
    subprocess.run(["qemu-img", "convert", "-f", fmt, "-O", "raw", img, out], check=True)
    data = file_bytes(out, off, n)
    os.unlink(out)
    return data


def qcow2_clean(img):
    r = subprocess.run(["qemu-img", "check", "-f", "qcow2", img], capture_output=True,
                       text=True)
    check(r.returncode == 0, "qemu-img check: %s%s" % (r.stdout, r.stderr))
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", img],
                                     capture_output=True, text=True, check=True).stdout)
    check(not info.get("dirty-flag"), "qcow2 image left dirty")


def wait_received(c, secs=30):
    """Until the server has read everything sent on c (SIOCOUTQ: bytes the peer
    has not read yet)."""
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if struct.unpack("i", fcntl.ioctl(c.s.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0] == 0:
            return
        time.sleep(0.01)
    raise Failure("the server did not read what was sent within %ds" % secs)


def half_write(c, off, n, sent):
    """A WRITE of n bytes of which only `sent` payload bytes are sent."""
    hdr = struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 0x5eed, off, n)
    c.send(hdr + pattern(0xee, sent))


def blocked_reader(sock, export):
    """A client that asks for 64 MiB of reads and never reads a reply."""
    c = connect(sock, export)
    c.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * K)
    for i in range(64):
        c.request(CMD_READ, i * M, M)
    return c


def exited_ok(srv, secs=60):
    """The daemon, already signalled, exits with status 0 within secs."""
    rc = srv.wait(secs)
    if rc is None:
        srv.kill()
    check(rc == 0, "daemon exit status %s after SIGTERM\n%s" % (rc, srv.text()[-3000:]))


# -- cases -----------------------------------------------------------------------------
def case_mid_payload(tmp, fmt, before):
    img, sock = os.path.join(tmp, "d." + fmt), os.path.join(tmp, "s")
    subprocess.run(["qemu-img", "create", "-q", "-f", fmt, img, "64M"], check=True)
    srv = Serve(["--image", "d,file=%s,format=%s" % (img, fmt),
                 "--nbd", "unix=%s,image=d,writable=on" % sock], os.path.join(tmp, "log"))
    try:
        c = connect(sock, "d")
        if before:  # FUA leaves nothing to flush: the half write is all the server has
            expect(c.write(0, pattern(0x5a, M), CF_FUA if before == "fua" else 0), [0],
                   "write before the signal")
        half_write(c, M, M, 512 * K)
        wait_received(c)  # the server holds the header and part of the payload
        srv.send_signal()
        c.expect_close("connection with a half-sent WRITE at shutdown")
        exited_ok(srv)
    finally:
        srv.close()
    check(qemu_img_read(img, fmt, 0, 2 * M) == (pattern(0x5a, M) if before else bytes(M)) +
          bytes(M), "image contents after shutdown")
    if fmt == "qcow2":
        qcow2_clean(img)


def case_skipping(tmp):
    img, sock = os.path.join(tmp, "ro.img"), os.path.join(tmp, "s")
    with open(img, "wb") as f:
        f.write(pattern(0x11, 4 * M))
    srv = Serve(["--image", "r,file=%s,read-only=on" % img,
                 "--nbd", "unix=%s,image=r" % sock], os.path.join(tmp, "log"))
    try:
        c = connect(sock, "r")
        half_write(c, 0, 2 * M, 256 * K)
        wait_received(c)
        srv.send_signal()
        # The refusal may come before the close; nothing else may.
        c.expect_close("connection skipping a refused payload at shutdown")
        exited_ok(srv)
    finally:
        srv.close()
    check(file_bytes(img, 0, 4 * M) == pattern(0x11, 4 * M), "read-only image changed")


def case_in_flight(tmp):
    sock = os.path.join(tmp, "s")
    srv = Serve(["--image", "n,driver=null,size=64M,latency-ns=300000000,mode=timer",
                 "--nbd", "unix=%s,image=n,writable=on" % sock], os.path.join(tmp, "log"))
    try:
        c = connect(sock, "n")
        cookies = [c.request(CMD_READ, i * 64 * K, 64 * K) for i in range(16)]
        cookies += [c.request(CMD_WRITE, i * 64 * K, 64 * K, 0, pattern(i, 64 * K))
                    for i in range(16)]
        wait_received(c)  # all 32 in the block layer (300 ms each)
        srv.send_signal()
        for ck in cookies:
            expect(c.wait(ck), [0], "request in flight at shutdown")
        c.expect_close("drained connection")
        exited_ok(srv)
    finally:
        srv.close()


def serve_raw(tmp):
    """A daemon on a sparse 64 MiB raw image, writable export "d"."""
    img, sock = os.path.join(tmp, "d.img"), os.path.join(tmp, "s")
    with open(img, "wb") as f:
        f.truncate(64 * M)
    srv = Serve(["--image", "d,file=" + img, "--nbd", "unix=%s,image=d,writable=on" % sock],
                os.path.join(tmp, "log"))
    return img, sock, srv


def case_reply_disconnect(tmp):
    img, sock, srv = serve_raw(tmp)
    try:
        c = blocked_reader(sock, "d")
        wait_received(c)
        c.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # reset while replies are being sent
        g = connect(sock, "d")
        expect(g.write(5 * M, pattern(0x77, 64 * K)), [0], "write after the reset")
        check(g.read(5 * M, 64 * K).data == pattern(0x77, 64 * K), "read after the reset")
        check(srv.alive(), "daemon died after a client reset mid-reply")
        srv.send_signal()
        g.expect_close("idle connection at shutdown")
        exited_ok(srv)
    finally:
        srv.close()
    check(file_bytes(img, 5 * M, 64 * K) == pattern(0x77, 64 * K), "image contents")


def handshake_clients(sock, export):
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(sock)                     # greeting never read
    flags = Conn(Args(sock))
    flags.handshake()                     # in the option phase
    opt = Conn(Args(sock))
    opt.handshake()
    opt.send(struct.pack(">QII", IHAVEOPT, OPT_GO, 100) + b"\0" * 10)  # half an option
    idle = connect(sock, export)          # transmission, nothing in flight
    return raw, [flags, opt, idle]


def expect_raw_close(s):
    s.settimeout(30)
    while True:
        try:
            if not s.recv(64 * K):
                return
        except ConnectionResetError:
            return
        except socket.timeout:
            raise Failure("unread handshake connection not closed at shutdown")


def case_handshake(tmp):
    sock = os.path.join(tmp, "s")
    srv = Serve(["--image", "n,driver=null,size=16M",
                 "--nbd", "unix=%s,image=n" % sock], os.path.join(tmp, "log"))
    try:
        raw, conns = handshake_clients(sock, "n")
        srv.send_signal()
        expect_raw_close(raw)
        for c in conns:
            c.expect_close("handshake-stage connection at shutdown")
        exited_ok(srv)
    finally:
        srv.close()


def case_blocked(tmp, second_signal):
    _, sock, srv = serve_raw(tmp)
    try:
        c = blocked_reader(sock, "d")
        wait_received(c)
        srv.send_signal()
        if second_signal:
            time.sleep(0.3)
            srv.send_signal()
        exited_ok(srv)
        check("dropping" in srv.text(), "no log line about dropping the connection")
        c.close()
    finally:
        srv.close()


def case_signal_in_teardown(tmp):
    """A second SIGTERM while the images are being flushed (1 s each on this null
    image) must not touch the NBD servers, which are gone by then."""
    sock = os.path.join(tmp, "s")
    srv = Serve(["--image", "n,driver=null,size=16M,latency-ns=1000000000,mode=timer",
                 "--nbd", "unix=%s,image=n,writable=on" % sock], os.path.join(tmp, "log"))
    try:
        srv.send_signal()
        time.sleep(0.5)
        srv.send_signal()
        exited_ok(srv)
    finally:
        srv.close()


def case_all_at_once(tmp):
    img, q, sock = os.path.join(tmp, "d.img"), os.path.join(tmp, "q.qcow2"), \
        os.path.join(tmp, "s")
    with open(img, "wb") as f:
        f.truncate(64 * M)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", q, "64M"], check=True)
    srv = Serve(["--iothreads", "2", "--image", "d,file=" + img,
                 "--image", "q,file=%s,format=qcow2" % q,
                 "--image", "n,driver=null,size=64M,latency-ns=300000000,mode=timer",
                 "--nbd", "unix=%s,image=d,writable=on" % sock,
                 "--nbd", "unix=%s,image=q,writable=on" % sock,
                 "--nbd", "unix=%s,image=n,writable=on" % sock], os.path.join(tmp, "log"))
    try:
        w = connect(sock, "q")
        expect(w.write(0, pattern(0x21, M)), [0], "qcow2 write")
        half_write(w, M, M, 100 * K)
        d = connect(sock, "d")
        expect(d.write(0, pattern(0x22, M)), [0], "raw write")
        half_write(d, M, 2 * M, M)
        f = connect(sock, "n")
        cookies = [f.request(CMD_READ, i * M, M) for i in range(8)]
        wait_received(f)
        raw, hs = handshake_clients(sock, "n")
        b = blocked_reader(sock, "d")
        for c in (w, d, f, b):
            wait_received(c)
        srv.send_signal()
        for ck in cookies:
            expect(f.wait(ck), [0], "request in flight at shutdown")
        for c in [w, d, f] + hs:
            c.expect_close("connection at shutdown")
        expect_raw_close(raw)
        exited_ok(srv)
        b.close()
    finally:
        srv.close()
    check(file_bytes(img, 0, 3 * M) == pattern(0x22, M) + bytes(2 * M), "raw image contents")
    check(qemu_img_read(q, "qcow2", 0, 2 * M) == pattern(0x21, M) + bytes(M),
          "qcow2 image contents")
    qcow2_clean(q)


CASES = [
    ("mid_payload_first", lambda t: case_mid_payload(t, "raw", None)),
    ("mid_payload_after_fua", lambda t: case_mid_payload(t, "raw", "fua")),
    ("mid_payload_dirty", lambda t: case_mid_payload(t, "raw", "write")),
    ("mid_payload_qcow2", lambda t: case_mid_payload(t, "qcow2", "write")),
    ("skipping", case_skipping),
    ("in_flight", case_in_flight),
    ("reply_disconnect", case_reply_disconnect),
    ("handshake", case_handshake),
    ("second_signal", lambda t: case_blocked(t, True)),
    ("drain_timeout", lambda t: case_blocked(t, False)),
    ("signal_in_teardown", case_signal_in_teardown),
    ("all_at_once", case_all_at_once),
]


def main():
    if not shutil.which("qemu-img"):
        print("SKIP: qemu-img is not installed")
        return 77
    return run_cases(CASES, (Failure, Closed, OSError, RuntimeError,
                             subprocess.CalledProcessError))


if __name__ == "__main__":
    sys.exit(main())
