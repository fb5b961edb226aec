#!/usr/bin/env python3
"""The STARTTLS state machine against hostile and broken clients, by hand.

Before TLS every option but ABORT and STARTTLS gets NBD_REP_ERR_TLS_REQD and EXPORT_NAME
ends the session; STARTTLS with data is ERR_INVALID, STARTTLS inside TLS is ERR_INVALID,
bytes sent after STARTTLS before its reply close the connection; a handshake that stalls
is closed by the handshake deadline while other clients are served; garbage instead of
a ClientHello, and garbage inside an established TLS stream, close that connection only
(logged with the peer address). Certificates come from tls-lib.sh (certtool).
"""

import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import time

import _tlsserve as ts

IHAVEOPT, REPLY_MAGIC = 0x49484156454F5054, 0x3E889045565A9
OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO = 1, 2, 3, 5, 6, 7
OPT_STRUCTURED_REPLY, OPT_LIST_META, OPT_EXTENDED = 8, 9, 11
REP_ACK, REP_INFO = 1, 3
ERR_INVALID, ERR_TLS_REQD = (1 << 31) + 3, (1 << 31) + 5
HANDSHAKE_DEADLINE = 30  # seconds, docs/nbd.md


class Conn:
    def __init__(self, port):
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.s = self.raw
        assert len(self.rd(18)) == 18
        self.s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES

    def rd(self, n):
        return ts.recv_exact(self.s, n)

    def opt(self, opt, data=b""):
        self.s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)

    def reply(self):
        magic, opt, typ, ln = struct.unpack(">QIII", self.rd(20))
        assert magic == REPLY_MAGIC, hex(magic)
        return opt, typ, self.rd(ln)

    def closed(self, wait=20):
        self.s.settimeout(wait)
        try:
            return self.s.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True
        except socket.timeout:
            return False

    def starttls(self, pki, cli="cli"):
        self.opt(OPT_STARTTLS)
        opt, typ, _ = self.reply()
        assert (opt, typ) == (OPT_STARTTLS, REP_ACK), (opt, typ)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(f"{pki}/{cli}/ca-cert.pem")
        ctx.load_cert_chain(f"{pki}/{cli}/client-cert.pem", f"{pki}/{cli}/client-key.pem")
        # Ragged EOFs raise: the server must end its side with a close_notify.
        self.s = ctx.wrap_socket(self.raw, server_hostname="localhost",
                                 suppress_ragged_eofs=False)

    def go(self, name):
        self.opt(OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
        while True:
            opt, typ, _ = self.reply()
            if typ == REP_ACK:
                break
            assert typ == REP_INFO, hex(typ)

    def go_read(self):
        """GO on export x, then READ 4096 bytes at 0: the data (simple replies)."""
        self.go(b"x")
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 7, 0, 4096))
        magic, err, cookie = struct.unpack(">IIQ", self.rd(16))
        assert (magic, err, cookie) == (0x67446698, 0, 7), (hex(magic), err, cookie)
        return self.rd(4096)


def good_client(port, pki):
    c = Conn(port)
    c.starttls(pki)
    data = c.go_read()
    assert data == b"\xa5" * 4096, "wrong data through TLS"
    c.s.close()


def bad_priority(ioplane, pki, img, tmp):
    """Credentials whose priority string GnuTLS refuses: every STARTTLS is refused
    (ERR_POLICY) and costs nothing once refused (the ASan build checks for leaks)."""
    port = ts.free_port()
    with open(f"{tmp}/bad.log", "w+") as log:
        srv = subprocess.Popen([ioplane, "serve", "--object",
                                f"tls-creds-x509,id=t,dir={pki}/srv,endpoint=server,"
                                "priority=NOT-A-PRIORITY",
                                "--blockdev", f"driver=file,filename={img},node-name=n0",
                                "--nbd-server", f"addr.type=inet,addr.host=127.0.0.1,"
                                f"addr.port={port},tls-creds=t",
                                "--export", "type=nbd,id=e0,node-name=n0,name=x"],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            ts.wait_listening(port, srv)
            c = Conn(port)
            for _ in range(3):
                c.opt(OPT_STARTTLS)
                assert c.reply()[1] == (1 << 31) + 2, "STARTTLS not refused"  # ERR_POLICY
            c.opt(OPT_ABORT)
            assert c.reply()[:2] == (OPT_ABORT, REP_ACK)
        finally:
            srv.terminate()
            rc = srv.wait(timeout=30)
            log.seek(0)
            text = log.read()
    assert rc == 0, f"server with a bad priority exited {rc}: {text[-3000:]}"


PATTERN_BLOCKS = 256  # 4 KiB blocks of export y, each filled with its own bytes


def pattern(i):
    return struct.pack(">I", i) * 1024


def read_burst(port, pki):
    """A burst of 4 KiB READs larger than one loop round dispatches (16 completions,
    io_uring): replies that wait for the rest of the burst all come, with the right
    data, and the connection goes on afterwards."""
    c = Conn(port)
    c.starttls(pki)
    c.go(b"y")
    for rnd in range(3):
        n = 64 + 37 * rnd
        blocks = [(7 * k + rnd) % PATTERN_BLOCKS for k in range(n)]
        c.s.sendall(b"".join(struct.pack(">IHHQQI", 0x25609513, 0, 0, 1000 * rnd + k,
                                         4096 * b, 4096) for k, b in enumerate(blocks)))
        seen = set()
        for _ in range(n):
            magic, err, cookie = struct.unpack(">IIQ", c.rd(16))
            assert (magic, err) == (0x67446698, 0), (hex(magic), err)
            k = cookie - 1000 * rnd
            assert 0 <= k < n and k not in seen, cookie
            seen.add(k)
            assert c.rd(4096) == pattern(blocks[k]), f"wrong data for block {blocks[k]}"
    c.s.close()


def read_one_by_one(port, pki):
    """Replies that linger for the client's next requests (docs/nbd.md, TLS): a client
    at depth 1 gets each reply; READs sent one record at a time while earlier ones are
    unanswered are all answered; a client that goes away while replies linger leaves
    the server serving the next one."""
    def read(c, cookie, b):
        c.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, cookie, 4096 * b, 4096))

    def answer(c, want):
        magic, err, cookie = struct.unpack(">IIQ", c.rd(16))
        assert (magic, err) == (0x67446698, 0) and cookie in want, (hex(magic), err, cookie)
        assert c.rd(4096) == pattern(want.pop(cookie)), f"wrong data for cookie {cookie}"

    c = Conn(port)
    c.starttls(pki)
    c.go(b"y")
    for k in range(40):
        read(c, k, (3 * k) % PATTERN_BLOCKS)
        answer(c, {k: (3 * k) % PATTERN_BLOCKS})
    for rnd in range(3):
        want = {}
        for k in range(48):
            want[1000 * rnd + k] = (5 * k + rnd) % PATTERN_BLOCKS
            read(c, 1000 * rnd + k, want[1000 * rnd + k])
            time.sleep(0.0002 * rnd)
        while want:
            answer(c, want)
    for k in range(3):
        read(c, 5000 + k, k)
    c.s.close()
    c = Conn(port)
    c.starttls(pki)
    c.go(b"y")
    read(c, 1, 9)
    answer(c, {1: 9})
    c.s.close()


def main():
    ioplane = ts.need()
    tmp = tempfile.mkdtemp(prefix="ioplane-tls-")
    pki = f"{tmp}/pki"
    ts.make_pki(pki)
    img = f"{tmp}/img.raw"
    with open(img, "wb") as f:
        f.write(b"\xa5" * (1 << 20))
    with open(f"{tmp}/pattern.raw", "wb") as f:
        f.write(b"".join(pattern(i) for i in range(PATTERN_BLOCKS)))
    bad_priority(ioplane, pki, img, tmp)
    port = ts.free_port()
    try:
        rc, text = ts.serve(ioplane, pki, port,
                            ["--blockdev", f"driver=file,filename={img},node-name=n0",
                             "--export", "type=nbd,id=e0,node-name=n0,name=x",
                             "--blockdev", f"driver=file,filename={tmp}/pattern.raw,"
                             "node-name=n1,aio=io_uring",
                             "--export", "type=nbd,id=e1,node-name=n1,name=y"],
                            f"{tmp}/serve.log", lambda srv: run(port, pki, srv))
    finally:
        shutil.rmtree(tmp)
    assert rc == 0, f"server exit status {rc}"
    for want in ("TLS handshake with 127.0.0.1:", "without TLS: TLS is required",
                 "TLS error from 127.0.0.1:",
                 "closing connection from 127.0.0.1:", "handshake timed out"):
        assert want in text, f"not logged: {want}"
    print("ok")


def run(port, pki, srv):
    # FORCEDTLS: every option before STARTTLS but ABORT gets TLS_REQD.
    c = Conn(port)
    for o in (OPT_LIST, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY, OPT_LIST_META, OPT_EXTENDED, 99):
        c.opt(o, b"\0" * 6 if o in (OPT_INFO, OPT_GO) else b"")
        opt, typ, _ = c.reply()
        assert (opt, typ) == (o, ERR_TLS_REQD), (o, hex(typ))
    # STARTTLS with data: ERR_INVALID, and the session goes on.
    c.opt(OPT_STARTTLS, b"xx")
    assert c.reply()[1] == ERR_INVALID
    c.opt(OPT_ABORT)
    assert c.reply()[:2] == (OPT_ABORT, REP_ACK)
    assert c.closed(), "ABORT did not close"

    # EXPORT_NAME before TLS cannot be answered: the session ends.
    c = Conn(port)
    c.opt(OPT_EXPORT_NAME, b"x")
    assert c.closed(), "EXPORT_NAME before TLS was served"

    # Inside TLS: STARTTLS again is ERR_INVALID; then GO and a READ work.
    c = Conn(port)
    c.starttls(pki)
    c.opt(OPT_STARTTLS)
    assert c.reply()[1] == ERR_INVALID
    assert c.go_read() == b"\xa5" * 4096
    c.s.close()

    # Many records in one burst (more than one readiness event reads): every one
    # is answered, though no more bytes arrive to wake the server.
    c = Conn(port)
    c.starttls(pki)
    c.go_read()
    for i in range(200):
        c.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 100 + i, 512 * i, 512))
    for i in range(200):
        magic, err, cookie = struct.unpack(">IIQ", c.rd(16))
        assert (magic, err) == (0x67446698, 0) and cookie == 100 + i, (hex(magic), err, cookie)
        assert c.rd(512) == b"\xa5" * 512
    c.s.close()

    read_burst(port, pki)
    read_one_by_one(port, pki)

    # ABORT inside TLS: ACK, then a clean TLS close (close_notify), not a bare EOF.
    c = Conn(port)
    c.starttls(pki)
    c.opt(OPT_ABORT)
    assert c.reply()[:2] == (OPT_ABORT, REP_ACK)
    c.s.settimeout(20)
    assert c.s.recv(1) == b"", "data after ABORT's ACK"
    c.s.close()

    # Bytes after STARTTLS, before its reply: closed.
    c = Conn(port)
    c.s.sendall(struct.pack(">QII", IHAVEOPT, OPT_STARTTLS, 0) + b"\x16\x03\x01junk")
    try:
        c.reply()
    except EOFError:
        pass
    assert c.closed(), "bytes after STARTTLS were accepted"

    # Garbage instead of a ClientHello: closed, logged.
    c = Conn(port)
    c.opt(OPT_STARTTLS)
    assert c.reply()[1] == REP_ACK
    c.s.sendall(b"\x16\x03\x01\x00\x04\x01\x00\x00\x00")  # an empty ClientHello
    assert c.closed(), "garbage handshake not closed"

    # Garbage inside an established TLS stream: closed; others carry on.
    c = Conn(port)
    c.starttls(pki)
    # Past the SSL object, straight to its socket: a record that fails to decrypt.
    os.write(c.s.fileno(), b"\x17\x03\x03\x00\x20" + os.urandom(32))
    assert c.closed(), "garbage record not closed"
    good_client(port, pki)

    # A stalled handshake: closed by the deadline; meanwhile others are served.
    stalled = Conn(port)
    stalled.opt(OPT_STARTTLS)
    assert stalled.reply()[1] == REP_ACK
    start = time.monotonic()
    good_client(port, pki)
    while time.monotonic() - start < HANDSHAKE_DEADLINE + 30:
        if stalled.closed(wait=5):
            break
    else:
        raise AssertionError("stalled handshake never closed")
    good_client(port, pki)
    assert srv.poll() is None, "server died"


if __name__ == "__main__":
    main()
