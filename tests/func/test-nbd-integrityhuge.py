#!/usr/bin/env python3
"""The `integrityhuge` mode of the NBD reference implementation's test client
(nbd-tester-client, which Debian does not package), reproduced: a client that negotiates
nothing (NBD_OPT_EXPORT_NAME, simple replies, no block sizes) and pipelines 250 random
READs, WRITEs (some FUA) and FLUSHes of up to ~48 MiB on a 50 MiB export, holding back a
request only while it overlaps one in flight as the original does, and checks every read
and finally the image against its own model.

The same client runs against `ioplane serve`, which must pass, and against nbdkit's file
plugin (the reference that passes) when nbdkit is installed; qemu-storage-daemon, which
disconnects on requests over 32 MiB, is run and reported but not judged.
"""

import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import (CMD_DISC, CMD_FLUSH, CMD_READ, CMD_WRITE, CF_FUA, IHAVEOPT,  # noqa
                       NBDMAGIC, OPT_EXPORT_NAME, REQUEST_MAGIC, SIMPLE_MAGIC)
from _nbdserve import Serve, listening, scratch_dir  # noqa: E402

M = 1 << 20
EXPORT_SIZE = 52428800        # the original's export
FILESIZE = 50 * 1000 * 1000   # the original's transaction generator's idea of it
TRANSACTIONS = 250


class Fail(Exception):
    pass


def transactions(seed):
    """As make-integrityhuge.c: lengths 0x400..FILESIZE-0x800 rounded to 1 KiB, reads and
    writes half each, 1 in 16 writes with FUA, 1 in 16 requests a flush."""
    rng = random.Random(seed)
    out = []
    for _ in range(TRANSACTIONS):
        length = (rng.getrandbits(64) % (FILESIZE - 0x800)) & ~0x3ff
        length += 0x400
        offset = (rng.getrandbits(64) % (FILESIZE - length)) & ~0x3ff
        flags = rng.getrandbits(64)
        cmd, fl = (CMD_READ if flags & 1 else CMD_WRITE), 0
        if not flags & 0x0f:
            cmd, fl = CMD_WRITE, CF_FUA
        if not flags & 0xf0:
            cmd, fl, offset, length = CMD_FLUSH, 0, 0, 0
        out.append((cmd, fl, offset, length))
    return out


def recv_exact(s, n, into=None):
    buf = into if into is not None else bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if not k:
            raise Fail("server closed the connection (%d of %d bytes)" % (got, n))
        got += k
    return buf


def handshake(s, name):
    magic, opt, hflags = struct.unpack(">QQH", recv_exact(s, 18))
    if magic != NBDMAGIC or opt != IHAVEOPT:
        raise Fail("not a newstyle server")
    cflags = 1 | (2 if hflags & 2 else 0)  # FIXED_NEWSTYLE, NO_ZEROES if offered
    nb = name.encode()
    s.sendall(struct.pack(">IQII", cflags, IHAVEOPT, OPT_EXPORT_NAME, len(nb)) + nb)
    size, _ = struct.unpack(">QH", recv_exact(s, 10))
    if not cflags & 2:
        recv_exact(s, 124)
    return size


class Client:
    """Pipelined like nbd-tester-client: one sender, one receiver; a request waits only
    while it overlaps a request in flight that it conflicts with."""

    def __init__(self, s, model, seed):
        self.s, self.model = s, model
        self.cond = threading.Condition()
        self.inflight = {}   # cookie -> (cmd, off, len, expected bytes or None)
        self.error = None
        self.rng = random.Random(seed + 1)

    def conflicts(self, cmd, off, n):
        for c2, o2, n2, _ in self.inflight.values():
            if c2 == CMD_FLUSH or cmd == CMD_FLUSH or off >= o2 + n2 or o2 >= off + n:
                continue
            if cmd == CMD_WRITE or c2 == CMD_WRITE:
                return True
        return False

    def send_all(self, txs):
        for cookie, (cmd, fl, off, n) in enumerate(txs, 1):
            with self.cond:
                while self.error is None and self.conflicts(cmd, off, n):
                    self.cond.wait(60)
                if self.error:
                    return
                data = self.rng.randbytes(n) if cmd == CMD_WRITE else None
                if cmd == CMD_WRITE:   # nothing overlapping is in flight
                    self.model[off:off + n] = data
                expect = bytes(self.model[off:off + n]) if cmd == CMD_READ else None
                self.inflight[cookie] = (cmd, off, n, expect)
            hdr = struct.pack(">IHHQQI", REQUEST_MAGIC, fl, cmd, cookie, off, n)
            self.s.sendall(hdr + data if data else hdr)

    def receive(self, count):
        buf = bytearray(64 * M)
        for _ in range(count):
            magic, err, cookie = struct.unpack(">IIQ", recv_exact(self.s, 16))
            if magic != SIMPLE_MAGIC:
                raise Fail("reply magic %#x" % magic)
            with self.cond:
                if cookie not in self.inflight:
                    raise Fail("reply for unknown cookie %d" % cookie)
                cmd, off, n, expect = self.inflight[cookie]
            if err:
                raise Fail("request %d (cmd %d, offset %d, length %d): error %d"
                           % (cookie, cmd, off, n, err))
            if cmd == CMD_READ:
                got = recv_exact(self.s, n, memoryview(buf)[:n])
                if got != expect:
                    raise Fail("read %d at %d (%d bytes): wrong data" % (cookie, off, n))
            with self.cond:
                del self.inflight[cookie]
                self.cond.notify_all()

    def run(self, txs):
        sender = threading.Thread(target=self._send, args=(txs,), daemon=True)
        sender.start()
        try:
            self.receive(len(txs))
        except (Fail, OSError) as e:
            with self.cond:
                self.error = e
                self.cond.notify_all()
            raise
        finally:
            sender.join(60)
        if self.error:
            raise self.error

    def _send(self, txs):
        try:
            self.send_all(txs)
        except OSError as e:
            with self.cond:
                self.error = self.error or Fail("send: %s" % e)
                self.cond.notify_all()


def integrityhuge(sock_path, name, image, seed=1):
    """Returns None on success, else what went wrong."""
    with open(image, "rb") as f:
        model = bytearray(f.read())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    try:
        s.connect(sock_path)
        size = handshake(s, name)
        if size != EXPORT_SIZE:
            return "export size %d, expected %d" % (size, EXPORT_SIZE)
        t0 = time.monotonic()
        Client(s, model, seed).run(transactions(seed))
        s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_DISC, 0, 0, 0))
        print("  %d transactions in %.1fs" % (TRANSACTIONS, time.monotonic() - t0))
    except (Fail, OSError) as e:
        return "%s: %s" % (type(e).__name__, e)
    finally:
        s.close()
    time.sleep(0.2)
    with open(image, "rb") as f:
        if f.read() != model:
            return "the image differs from the client's model"
    return None


def make_image(path):
    with open(path, "wb") as f:
        f.write(random.Random(7).randbytes(EXPORT_SIZE))


def wait_socket(path, proc, secs=30):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline and proc.poll() is None:
        if listening(path):
            return True
        time.sleep(0.05)
    return False


def peer(tmp, cmd_fn, what):
    img, sock = os.path.join(tmp, what + ".img"), os.path.join(tmp, what + ".sock")
    make_image(img)
    log = open(os.path.join(tmp, what + ".log"), "w+")
    p = subprocess.Popen(cmd_fn(img, sock), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        if not wait_socket(sock, p):
            return "did not start"
        return integrityhuge(sock, "e", img)
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


def main():
    failed = False
    with scratch_dir() as tmp:
        img, sock = os.path.join(tmp, "d.img"), os.path.join(tmp, "nbd.sock")
        make_image(img)
        srv = Serve(["--image", "e,file=%s,cache=writeback" % img,
                     "--nbd", "unix=%s,image=e,writable=on" % sock], os.path.join(tmp, "log"))
        try:
            err = integrityhuge(sock, "e", img)
            print("ioplane: %s" % (err or "pass"))
            failed |= err is not None
            rc = srv.stop()
            if rc != 0:
                print("ioplane: exit status %d after SIGTERM\n%s" % (rc, srv.text()[-2000:]))
                failed = True
        finally:
            srv.close()
        if shutil.which("nbdkit"):
            err = peer(tmp, lambda i, s: ["nbdkit", "-f", "-U", s, "-e", "e", "file", i],
                       "nbdkit")
            print("nbdkit (reference): %s" % (err or "pass"))
            failed |= err is not None
        if shutil.which("qemu-storage-daemon"):
            err = peer(tmp, lambda i, s: [
                "qemu-storage-daemon", "--blockdev",
                "driver=file,node-name=f,filename=%s" % i, "--nbd-server",
                "addr.type=unix,addr.path=%s" % s, "--export",
                "type=nbd,id=x,node-name=f,name=e,writable=on"], "qsd")
            print("qemu-storage-daemon (not judged): %s" % (err or "pass"))
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
