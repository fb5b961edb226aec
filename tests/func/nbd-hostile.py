#!/usr/bin/env python3
"""Hostile NBD client against `ioplane serve` (test-nbd-hostile.sh, or standalone).

It completes the fixed-newstyle handshake itself, then sends malformed and hostile options
and requests. Every reply is checked against doc/proto.md of the NetworkBlockDevice/nbd
project (message layout, chunk rules, error values). Meanwhile a well-behaved connection
keeps writing and verifying in a background thread, and after each case a fresh
connection must be served correctly and the daemon must still run.

Layout of the writable export (16 MiB, set up by the shell script as a sparse file):
  [0, 1M)    canary: random data written at start; hostile requests must never change it
  [1M, 8M)   scratch for cases whose writes are legitimate
  [8M, 12M)  never written: a hole
  [12M, 14M) the background client's region; [14M, 16M) the after-each-case check's region

With --socket it tests a running server (test-nbd-hostile.sh starts one). Without it (the
test runner also runs tests/func/*.py directly) it starts $IOPLANE serve itself, on the
epoll loop backend, so that the two runs together cover both loop backends.
"""

import argparse
import hashlib
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True      # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _nbdproto import *             # noqa: E402,F403  (constants, Conn, check, expect, ...)

K, M = 1 << 10, 1 << 20
CANARY = (0, 1 * M)
SCRATCH = (1 * M, 8 * M)
HOLE = (8 * M, 12 * M)
BG_REGION = (12 * M, 14 * M)
CHECK_REGION = (14 * M, 16 * M)

# ---------------------------------------------------------------------------------------
class Harness:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.failures = []
        self.canary = self.rng.randbytes(CANARY[1] - CANARY[0])
        self.scratch_pat = self.rng.randbytes(M)
        self.bg_errors = []
        self.bg_ops = 0
        self.stop = threading.Event()

    def connect(self, export=None, structured=True, ext=False, meta=True, timeout=None):
        c = Conn(self.args, timeout)
        c.handshake()
        if ext:
            c.extended_headers()
        elif structured:
            c.structured_reply()
        if meta and (structured or ext):
            c.set_meta(export or self.args.export)
        c.go(export or self.args.export)
        return c

    def setup(self):
        c = self.connect()
        self.size = c.size
        check(self.size >= 16 * M, "export %s is %d bytes, need 16 MiB" % (self.args.export,
                                                                        self.size))
        expect(c.write(CANARY[0], self.canary), [0], "setup write")
        expect(c.write(7 * M, self.scratch_pat), [0], "setup write")
        expect(c.cmd(CMD_FLUSH), [0], "setup flush")
        c.close()
        r = self.connect(self.args.ro_export)
        self.ro_size = r.size
        self.ro_sum = hashlib.sha256(r.read(0, r.size).data).hexdigest()
        r.close()

    # -- the well-behaved clients ---------------------------------------------------------
    def verify_region(self, c, region, rng):
        lo, hi = region
        off = lo + rng.randrange((hi - lo) // (64 * K)) * 64 * K
        data = rng.randbytes(64 * K)
        expect(c.write(off, data), [0], "good write")
        got = c.read(off, len(data))
        expect(got, [0], "good read")
        check(bytes(got.data) == data, "good client read back different data at %d" % off)

    def background(self):
        rng = random.Random(self.args.seed + 1)
        try:
            c = self.connect()
            while not self.stop.is_set():
                self.verify_region(c, BG_REGION, rng)
                self.bg_ops += 1
                time.sleep(0.01)
            c.request(CMD_DISC)
            c.close()
        except (Failure, Closed, OSError) as e:
            self.bg_errors.append("background client: %s: %s" % (type(e).__name__, e))

    def after_case(self, name):
        """Daemon alive, a fresh connection served, canary and read-only data intact."""
        if self.args.pid:
            try:
                os.kill(self.args.pid, 0)
            except ProcessLookupError:
                raise Failure("the daemon died")
        c = self.connect(timeout=30)
        self.verify_region(c, CHECK_REGION, self.rng)
        got = c.read(CANARY[0], CANARY[1] - CANARY[0])
        expect(got, [0], "canary read")
        check(bytes(got.data) == self.canary, "canary region changed")
        c.request(CMD_DISC)
        c.close()
        if name.startswith("ro_"):
            r = self.connect(self.args.ro_export, timeout=30)
            s = hashlib.sha256(r.read(0, r.size).data).hexdigest()
            check(s == self.ro_sum, "read-only export changed")
            r.close()
        if self.bg_errors:
            raise Failure(self.bg_errors[0])

    def run(self, cases):
        try:
            self.setup()
        except (Failure, Closed, OSError) as e:
            print("FAIL setup: %s: %s" % (type(e).__name__, e), flush=True)
            self.failures.append("setup")
            return False
        bg = threading.Thread(target=self.background, daemon=True)
        bg.start()
        for name, fn in cases:
            if self.args.only and self.args.only not in name:
                continue
            t0 = time.monotonic()
            try:
                fn(self)
                self.after_case(name)
                print("ok   %-28s %.2fs" % (name, time.monotonic() - t0), flush=True)
            except (Failure, Closed, OSError) as e:
                print("FAIL %-28s %s: %s" % (name, type(e).__name__, e), flush=True)
                self.failures.append(name)
                if self.args.pid and not pid_alive(self.args.pid):
                    print("the daemon died; stopping", flush=True)
                    break
        self.stop.set()
        bg.join(30)
        if self.bg_errors:
            print("FAIL background: %s" % self.bg_errors[0])
            self.failures.append("background")
        check_bg = self.bg_ops > 0 or self.args.only
        if not check_bg:
            print("FAIL background client did no I/O")
            self.failures.append("background")
        print("%d background write/read/verify rounds" % self.bg_ops)
        return not self.failures


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


# ---------------------------------------------------------------------------------------
# Cases: handshake phase.

def h_bad_client_flags(h):
    c = Conn(h.args)
    c.greet()
    c.send(struct.pack(">I", 0x80000001))
    # "the server MUST drop the TCP connection if the client sets an unknown flag"
    c.expect_close("unknown client flag")


def h_no_zeroes_not_offered(h):
    c = Conn(h.args)
    c.greet()
    if c.hflags & FLAG_NO_ZEROES:
        c.close()
        return
    c.send(struct.pack(">I", C_FIXED_NEWSTYLE | C_NO_ZEROES))
    c.expect_close("NO_ZEROES without the server offering it")


def h_bad_option_magic(h):
    c = Conn(h.args)
    c.handshake()
    c.send(struct.pack(">QII", 0x1122334455667788, OPT_GO, 0))
    c.expect_close("bad option magic")


def h_unknown_option(h):
    c = Conn(h.args)
    c.handshake()
    c.opt_expect(0x1234, b"x" * 100, [ERR_UNSUP], "unknown option 0x1234")
    c.opt_expect(0x7FFFFFFF, b"", [ERR_UNSUP], "unknown option 0x7fffffff")
    c.opt_expect(4, b"abcd", [ERR_UNSUP], "withdrawn PEEK_EXPORT")
    c.structured_reply()
    c.go(h.args.export)
    check(bytes(c.read(0, 4096).data) == h.canary[:4096], "read after unknown options")


def h_many_options(h):
    c = Conn(h.args)
    c.handshake()
    for i in range(200):
        c.opt_expect(0x4000 + i, b"y" * (i % 50), [ERR_UNSUP], "unknown option #%d" % i)
    c.go(h.args.export)
    check(bytes(c.read(4096, 4096).data) == h.canary[4096:8192], "read after 200 options")


def h_info_missing(h):
    c = Conn(h.args)
    c.handshake()
    rtype, got = c.info("no-such-export", (INFO_BLOCK_SIZE,))
    check(rtype == ERR_UNKNOWN, "INFO for a missing export: %s" % repname(rtype))
    check(not got, "INFO replies for a missing export")
    rtype, got = c.info(h.args.export, (INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 0x7777))
    check(rtype == REP_ACK, "INFO: %s" % repname(rtype))
    size, tf = struct.unpack(">QH", got[INFO_EXPORT])
    check(size == h.size, "INFO size %d, GO size %d" % (size, h.size))
    check(not tf & TF_READ_ONLY, "writable export flagged read-only")
    check(0x7777 not in got, "server answered an unknown info request")
    if INFO_NAME in got:
        got[INFO_NAME].decode("utf-8")
    rtype, got = c.info(h.args.ro_export, ())
    check(rtype == REP_ACK, "INFO read-only export: %s" % repname(rtype))
    check(struct.unpack(">QH", got[INFO_EXPORT])[1] & TF_READ_ONLY, "ro export not READ_ONLY")
    c.opt_expect(OPT_ABORT, b"", [REP_ACK], "ABORT")
    c.expect_close("after ABORT")


def h_go_missing(h):
    c = Conn(h.args)
    c.handshake()
    rtype, got = c.info("nosuch", (), go=True)
    check(rtype == ERR_UNKNOWN, "GO for a missing export: %s" % repname(rtype))
    c.go(h.args.export)
    check(c.read(0, 512).data == h.canary[:512], "read after failed GO")


def h_go_bad_lengths(h):
    c = Conn(h.args)
    c.handshake()
    # Name length beyond the option data.
    d = struct.pack(">I", 1000) + b"abc" + struct.pack(">H", 0)
    try:
        c.opt_expect(OPT_GO, d, [ERR_INVALID, ERR_UNKNOWN, ERR_TOO_BIG], "GO name length")
        # Number of info requests beyond the option data.
        nb = h.args.export.encode()
        d = struct.pack(">I", len(nb)) + nb + struct.pack(">H", 500) + b"\0\3"
        c.opt_expect(OPT_INFO, d, [ERR_INVALID], "INFO request count")
        # Too short to hold a name length at all.
        c.opt_expect(OPT_GO, b"\0\0", [ERR_INVALID], "GO of 2 bytes")
    except Closed:
        return      # a hard disconnect is allowed for a broken option
    c.go(h.args.export)
    check(c.read(0, 512).data == h.canary[:512], "read after bad GO")


def h_oversized_option(h):
    for opt, ln in ((OPT_GO, 1 << 30), (OPT_SET_META_CONTEXT, 0xFFFFFFFF),
                    (OPT_LIST, 0x80000000), (0xDEAD, 0xFFFFFFF0)):
        c = Conn(h.args, timeout=10)
        c.handshake()
        c.opt(opt, b"\0" * 64, length=ln)
        try:
            rtype, _ = c.opt_reply(opt)
            check(rtype & E, "option %d with length %d: %s" % (opt, ln, repname(rtype)))
        except Closed:
            pass
        c.close()


def h_list(h):
    c = Conn(h.args)
    c.handshake()
    c.opt_expect(OPT_LIST, b"junk", [ERR_INVALID], "LIST with data")
    c.opt(OPT_LIST)
    names = []
    while True:
        rtype, d = c.opt_reply(OPT_LIST)
        if rtype != REP_SERVER:
            break
        n = struct.unpack(">I", d[:4])[0]
        check(n <= len(d) - 4, "REP_SERVER name length %d > %d" % (n, len(d) - 4))
        names.append(d[4:4 + n].decode("utf-8"))
    check(rtype == REP_ACK, "LIST ended with %s" % repname(rtype))
    for want in (h.args.export, h.args.ro_export):
        check(want in names, "LIST lacks %r: %r" % (want, names))
    c.go(h.args.export)


def h_structured_and_starttls(h):
    c = Conn(h.args)
    c.handshake()
    c.opt_expect(OPT_STRUCTURED_REPLY, b"abcd", [ERR_INVALID], "STRUCTURED_REPLY with data")
    c.opt_expect(OPT_EXTENDED_HEADERS, b"ab", [ERR_INVALID], "EXTENDED_HEADERS with data")
    rtype = c.opt_expect(OPT_STARTTLS, b"", list(REP_ERR), "STARTTLS")
    check(rtype != ERR_TLS_REQD, "TLS_REQD from a server without TLS")
    c.structured_reply()
    c.go(h.args.export)
    r = c.read(0, 4096)
    check(not r.simple and r.data == h.canary[:4096], "structured read")


def h_meta_contexts(h):
    c = Conn(h.args)
    c.handshake()
    rtype, _ = c.meta(OPT_SET_META_CONTEXT, h.args.export, ["base:allocation"])
    check(rtype in (ERR_INVALID, ERR_EXT_HEADER_REQD),
          "SET_META_CONTEXT before structured replies: %s" % repname(rtype))
    c.structured_reply()
    rtype, found = c.meta(OPT_LIST_META_CONTEXT, h.args.export, [])
    check(rtype == REP_ACK and "base:allocation" in found.values(),
          "LIST_META_CONTEXT with no query: %s %r" % (repname(rtype), found))
    rtype, found = c.meta(OPT_LIST_META_CONTEXT, h.args.export, ["base:"])
    check(rtype == REP_ACK and "base:allocation" in found.values(), "LIST base: %r" % found)
    rtype, found = c.meta(OPT_LIST_META_CONTEXT, h.args.export, ["x-nosuch:thing"])
    check(rtype == REP_ACK and not found, "unknown namespace must be ignored: %r" % found)
    rtype, found = c.meta(OPT_SET_META_CONTEXT, "nosuch", ["base:allocation"])
    check(rtype & E, "SET_META_CONTEXT for a missing export: %s" % repname(rtype))
    # Query length reaching past the option data: MUST fail with INVALID.
    d = c.meta_data(h.args.export, ["base:allocation"])[:-4]
    c.opt_expect(OPT_SET_META_CONTEXT, d, [ERR_INVALID], "truncated query")
    d = c.meta_data(h.args.export, []) [:-4] + struct.pack(">I", 100000)
    c.opt_expect(OPT_SET_META_CONTEXT, d, [ERR_INVALID], "query count beyond data")
    found = c.set_meta(h.args.export, ["base:allocation", "base:nosuch", "x-foo:bar"])
    check(list(found.values()) == ["base:allocation"], "SET_META_CONTEXT selected %r" % found)
    c.go(h.args.export)
    r = c.cmd(CMD_BLOCK_STATUS, 0, 4096, CF_REQ_ONE)
    expect(r, [0], "BLOCK_STATUS after SET_META_CONTEXT")


def h_no_meta_block_status(h):
    c = h.connect(meta=False)
    expect(c.cmd(CMD_BLOCK_STATUS, 0, 4096), [EINVAL], "BLOCK_STATUS without a context")
    # Zero queries select nothing either.
    c2 = Conn(h.args)
    c2.handshake()
    c2.structured_reply()
    check(c2.set_meta(h.args.export, []) == {}, "zero queries selected a context")
    c2.go(h.args.export)
    expect(c2.cmd(CMD_BLOCK_STATUS, 0, 4096), [EINVAL], "BLOCK_STATUS with no context")
    check(c2.read(0, 512).data == h.canary[:512], "read after refused BLOCK_STATUS")


def h_export_name(h):
    # NBD_OPT_EXPORT_NAME for a missing export: the server MUST terminate the session.
    c = Conn(h.args)
    c.handshake()
    c.opt(OPT_EXPORT_NAME, b"no-such-export")
    c.expect_close("EXPORT_NAME of a missing export")
    for no_zeroes in (True, False):
        c = Conn(h.args)
        c.handshake(no_zeroes=no_zeroes)
        c.opt(OPT_EXPORT_NAME, h.args.export.encode())
        size, tf = struct.unpack(">QH", c.recv(10))
        check(size == h.size, "EXPORT_NAME size %d" % size)
        c.check_tflags(tf)
        if not c.no_zeroes:
            check(c.recv(124) == b"\0" * 124, "124 zero bytes after EXPORT_NAME")
        c.size = size
        r = c.read(0, 4096)
        check(r.simple and r.data == h.canary[:4096], "simple read after EXPORT_NAME")
        c.request(CMD_DISC)
        c.expect_close("after DISC")


def h_extended_then_structured(h):
    c = Conn(h.args)
    c.handshake()
    c.extended_headers()
    rtype = c.opt_expect(OPT_STRUCTURED_REPLY, b"", [ERR_EXT_HEADER_REQD, REP_ACK],
                         "STRUCTURED_REPLY after EXTENDED_HEADERS")
    c.set_meta(h.args.export)
    c.go(h.args.export)
    r = c.read(0, 8192)     # must come back with extended reply headers
    check(r.data == h.canary[:8192], "extended read data")


def h_abort_and_truncated(h):
    c = Conn(h.args)
    c.handshake()
    c.opt(OPT_ABORT, b"ignored")
    try:
        rtype, _ = c.opt_reply(OPT_ABORT)
        check(rtype == REP_ACK, "ABORT: %s" % repname(rtype))
    except Closed:
        pass
    c.expect_close("after ABORT")
    # Half an option header, then gone.
    c = Conn(h.args)
    c.handshake()
    c.send(struct.pack(">QI", IHAVEOPT, OPT_GO)[:11])
    c.close()
    # An option announcing 100 bytes, 50 sent, then gone.
    c = Conn(h.args)
    c.handshake()
    c.opt(OPT_GO, b"\0" * 50, length=100)
    c.close()
    # Gone before sending the client flags; and before reading the greeting.
    c = Conn(h.args)
    c.recv(10)
    c.close()
    Conn(h.args).close()


def h_idle_connections(h):
    # Twenty clients that connect and then do nothing must not stop others being served.
    idle = []
    for i in range(20):
        c = Conn(h.args)
        if i % 2:
            c.greet()
        idle.append(c)
    c = h.connect(timeout=10)
    check(c.read(0, 4096).data == h.canary[:4096], "read with 20 idle connections")
    c.close()
    for c in idle:
        c.close()


# ---------------------------------------------------------------------------------------
# Cases: transmission phase (structured replies unless said otherwise).

def t_bad_magic(h):
    c = h.connect()
    check(c.read(0, 512).data == h.canary[:512], "read before bad magic")
    c.send(struct.pack(">IHHQQI", 0x12345678, 0, CMD_READ, 1, 0, 512))
    c.expect_close("bad request magic")
    c = h.connect()
    c.send(struct.pack(">IHHQQI", 0x12560953, 0, CMD_READ, 1, 0, 512))   # historic magic
    c.expect_close("historic request magic")


def t_garbage(h):
    c = h.connect()
    rng = random.Random(h.args.seed + 7)
    try:
        c.send(b"\xff" + rng.randbytes(M - 1))
    except Closed:
        return
    c.expect_close("1 MiB of garbage")


def t_unknown_command(h):
    c = h.connect()
    for t in (8, 0x42, 0xFFFF):
        expect(c.cmd(t, 0, 4096), [EINVAL], "unknown command %d" % t)
    check(c.read(0, 4096).data == h.canary[:4096], "read after unknown commands")


def t_unknown_flags(h):
    c = h.connect()
    expect(c.read(0, 4096, 1 << 12), [EINVAL], "READ with flag bit 12")
    expect(c.read(0, 4096, 1 << 15), [EINVAL], "READ with flag bit 15")
    # The payload of a refused WRITE must be consumed, not parsed as requests.
    junk = struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 99, 0, 0) * 128
    expect(c.write(0, junk, 1 << 9), [EINVAL], "WRITE with flag bit 9")
    expect(c.write(4096, b"\x55" * 4096, CF_DF), [EINVAL], "WRITE with DF")
    expect(c.write(8192, b"\x55" * 4096, CF_REQ_ONE), [EINVAL], "WRITE with REQ_ONE")
    expect(c.read(0, 4096, CF_REQ_ONE), [EINVAL], "READ with REQ_ONE")
    expect(c.read(0, 4096, CF_NO_HOLE), [EINVAL], "READ with NO_HOLE")
    expect(c.cmd(CMD_FLUSH, 0, 0, CF_DF), [EINVAL], "FLUSH with DF")
    expect(c.cmd(CMD_TRIM, 0, 4096, CF_NO_HOLE | CF_REQ_ONE), [EINVAL], "TRIM with bad flags")
    if c.tflags & TF_SEND_FUA:
        expect(c.read(0, 4096, CF_FUA), [0], "READ with FUA (MUST be accepted)")
    check(c.read(0, 65536).data == h.canary[:65536], "read after refused requests")


def t_past_end(h):
    c = h.connect()
    s = c.size
    tail = c.read(s - 4096, 4096).data
    big = 1 << 64
    for off, ln in ((s - 4096, 8192), (s, 1), (s + 4096, 4096), (big - 512, 1024),
                    (big - 4096, 4096), (1 << 63, 4096)):
        expect(c.read(off, ln), [EINVAL], "READ %#x+%d past the end" % (off, ln))
        expect(c.write(off, b"\x66" * ln), [ENOSPC, EINVAL], "WRITE %#x+%d" % (off, ln))
        expect(c.cmd(CMD_TRIM, off, ln), [EINVAL, ENOSPC], "TRIM %#x+%d" % (off, ln))
        expect(c.cmd(CMD_WRITE_ZEROES, off, ln), [ENOSPC, EINVAL], "WRITE_ZEROES %#x" % off)
        expect(c.cmd(CMD_CACHE, off, ln), [EINVAL], "CACHE %#x+%d" % (off, ln))
        # The length of BLOCK_STATUS is a hint; only a start past the end is invalid.
        expect(c.cmd(CMD_BLOCK_STATUS, off, ln), [EINVAL] if off >= s else [EINVAL, 0],
               "BLOCK_STATUS %#x+%d" % (off, ln))
    expect(c.read(0, 0xFFFFFFFF), [EINVAL, EOVERFLOW], "READ of 4 GiB - 1")
    check(c.read(s - 4096, 4096).data == tail, "the last block changed")
    check(c.read(0, 4096).data == h.canary[:4096], "read after out-of-range requests")


def t_oversized_write(h):
    c = Conn(h.args)
    c.handshake()
    c.structured_reply()
    got = c.go(h.args.export, (INFO_BLOCK_SIZE,))
    mx = struct.unpack(">III", got[INFO_BLOCK_SIZE])[2] if INFO_BLOCK_SIZE in got else 32 * M
    ln = max(mx, 32 * M) + 4096
    if ln >= 1 << 32:
        print("     (max payload %d: no oversized write possible)" % mx)
        return
    cookie = c.request(CMD_WRITE, 0, ln)
    try:
        chunk = b"\x77" * M
        for i in range(0, ln, M):
            c.send(chunk[:min(M, ln - i)])
    except Closed:
        return      # disconnecting is allowed (proto.md, "Size constraints")
    try:
        res = c.wait(cookie)
    except Closed:
        return
    expect(res, [EOVERFLOW, EINVAL, ENOMEM], "WRITE of %d bytes" % ln)
    # Still in sync: the payload was consumed.
    check(c.read(0, 4096).data == h.canary[:4096], "read after oversized write")


def ro_readonly(h):
    c = h.connect(h.args.ro_export)
    check(c.tflags & TF_READ_ONLY, "read-only export without NBD_FLAG_READ_ONLY")
    before = c.read(0, 65536).data
    junk = struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 99, 0, 0) * 256
    expect(c.write(0, junk), [EPERM], "WRITE on a read-only export")
    expect(c.write(4096, b"\x11" * 4096, CF_FUA), [EPERM], "FUA WRITE on a read-only export")
    expect(c.cmd(CMD_TRIM, 0, 65536), [EPERM, EINVAL], "TRIM on a read-only export")
    expect(c.cmd(CMD_WRITE_ZEROES, 0, 65536), [EPERM, EINVAL], "WRITE_ZEROES read-only")
    expect(c.cmd(CMD_WRITE_ZEROES, 0, 65536, CF_NO_HOLE), [EPERM, EINVAL], "NO_HOLE ro")
    expect(c.write(c.size, b"\x11" * 4096), [EPERM, ENOSPC, EINVAL], "ro WRITE past end")
    if c.tflags & TF_SEND_FLUSH:
        expect(c.cmd(CMD_FLUSH), [0], "FLUSH on a read-only export")
    check(c.read(0, 65536).data == before, "read-only export changed")



def t_truncated_requests(h):
    c = h.connect()
    c.send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, 1, 0, 4096)[:20])
    c.close()
    # A write to the canary whose payload never completes: nothing may be written.
    c = h.connect()
    c.send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 2, 0, 65536) + b"\x99" * 1000)
    c.close()
    # Acknowledged writes survive a client that then vanishes mid-request.
    c = h.connect()
    pat = h.rng.randbytes(3 * 65536)
    for i in range(3):
        expect(c.write(2 * M + i * 65536, pat[i * 65536:(i + 1) * 65536]), [0], "write")
    c.send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_WRITE, 3, 0, 65536) + b"\x98" * 30000)
    c.close()
    time.sleep(0.2)
    c = h.connect()
    check(c.read(2 * M, 3 * 65536).data == pat, "acknowledged writes lost")


def t_pipeline(h):
    c = h.connect()
    rng = random.Random(h.args.seed + 3)
    base = 3 * M
    blocks = [rng.randbytes(4096) for _ in range(64)]
    cookies = [c.request(CMD_WRITE, base + i * 4096, 4096, 0, blocks[i]) for i in range(64)]
    for ck in cookies:
        expect(c.wait(ck), [0], "pipelined write")
    reads = [c.request(CMD_READ, base + i * 4096, 4096) for i in range(64)]
    results = [c.pending[ck] for ck in reads]
    while c.pending:
        c.one_reply()
    for i, r in enumerate(results):
        check(r.error == 0 and r.data == blocks[i], "pipelined read %d" % i)
    # Extreme cookies are echoed.
    for ck in (0, (1 << 64) - 1, 0x8000000000000000):
        c.request(CMD_READ, base, 4096, cookie=ck)
        check(c.wait(ck).data == blocks[0], "cookie %#x" % ck)
    c2 = h.connect()
    for i in range(64):
        check(c2.read(base + i * 4096, 4096).data == blocks[i], "pipelined block %d" % i)


def t_disc_with_inflight(h):
    c = h.connect()
    rng = random.Random(h.args.seed + 4)
    base = 4 * M
    data = rng.randbytes(16 * 65536)
    for i in range(16):
        c.request(CMD_WRITE, base + i * 65536, 65536, 0, data[i * 65536:(i + 1) * 65536])
    c.request(CMD_DISC)
    disc = [k for k, r in c.pending.items() if r.req[0] == CMD_DISC]
    for k in disc:
        del c.pending[k]
    # "The server MUST handle all outstanding requests" before closing: the writes land.
    # Whether their replies are still sent is not spelled out; any that come must be valid.
    try:
        while c.pending:
            c.one_reply()
    except Closed:
        pass
    c.expect_close("after DISC")
    c2 = h.connect()
    check(c2.read(base, len(data)).data == data, "writes before DISC lost")


def t_structured_read(h):
    c = h.connect()
    # Data then hole: content correct and chunks valid (checked while parsing).
    r = c.read(7 * M + 512 * K, M)
    expect(r, [0], "read across data and hole")
    check(r.data == h.scratch_pat[512 * K:] + b"\0" * (512 * K), "data/hole read content")
    # Entirely inside the hole: the block layer knows it is zero, so OFFSET_HOLE is used.
    r = c.read(HOLE[0] + M, M)
    check(r.data == b"\0" * M, "hole reads as zero")
    check(r.holes >= 1, "no OFFSET_HOLE chunk for a read inside a hole")
    if c.tflags & TF_SEND_DF:
        r = c.read(7 * M + 512 * K, M, CF_DF)
        expect(r, [0, EOVERFLOW], "DF read")
        if r.error == 0:
            check(r.data == h.scratch_pat[512 * K:] + b"\0" * (512 * K), "DF read content")
        r = c.read(7 * M, 65536, CF_DF)
        expect(r, [0], "DF read of 64 KiB (MUST be supported)")
    # Unaligned small reads.
    for off, ln in ((1, 1), (4095, 2), (12345, 54321)):
        check(c.read(off, ln).data == h.canary[off:off + ln], "read %d+%d" % (off, ln))


def t_simple_replies(h):
    c = h.connect(structured=False)
    r = c.read(0, 65536)
    check(r.simple and r.data == h.canary[:65536], "simple read")
    # An error reply carries no payload; the next reply must still parse.
    expect(c.read(c.size, 65536), [EINVAL], "simple READ past the end")
    expect(c.cmd(0x55, 0, 4096), [EINVAL], "simple unknown command")
    r = c.read(4096, 4096)
    check(r.data == h.canary[4096:8192], "simple read after errors")
    res = c.cmd(CMD_BLOCK_STATUS, 0, 4096)
    expect(res, [EINVAL], "BLOCK_STATUS without structured replies")


def t_block_status(h):
    c = h.connect()
    (cid,) = c.contexts
    r = c.cmd(CMD_BLOCK_STATUS, 0, c.size, CF_REQ_ONE)
    expect(r, [0], "BLOCK_STATUS REQ_ONE")
    r = c.cmd(CMD_BLOCK_STATUS, 7 * M, 2 * M)
    expect(r, [0], "BLOCK_STATUS")
    pos = 7 * M
    for n, st in r.extents[cid]:
        # [7M, 8M) holds random data: it must not be claimed to read as zeroes.
        check(pos >= 8 * M or not st & 2, "data at %d reported as zero" % pos)
        if pos <= HOLE[0] + 4096 < pos + n:
            check(st & 2, "hole at 8 MiB not reported as zero")
        pos += n
    r = c.cmd(CMD_BLOCK_STATUS, HOLE[0] + 4096, 4096, CF_REQ_ONE)
    expect(r, [0], "BLOCK_STATUS in the hole")
    check(r.extents[cid][0][1] & 2, "hole not reported as zero")
    expect(c.cmd(CMD_BLOCK_STATUS, 0, 4096, CF_DF), [EINVAL], "BLOCK_STATUS with DF")


def t_zero_length(h):
    c = h.connect()
    for cmd in (CMD_READ, CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE, CMD_BLOCK_STATUS):
        r = c.cmd(cmd, 4096, 0)
        check_errno(r.error)
    check(c.read(0, 4096).data == h.canary[:4096], "read after zero-length requests")


def t_flush_and_friends(h):
    c = h.connect()
    r = c.cmd(CMD_FLUSH, 4096, 4096)       # offset/length MUST be zero: client error
    check_errno(r.error)
    expect(c.cmd(CMD_FLUSH), [0], "FLUSH")
    base = 5 * M
    pat = h.rng.randbytes(256 * K)
    expect(c.write(base, pat, CF_FUA), [0], "FUA write")
    check(c.read(base, len(pat)).data == pat, "FUA write content")
    expect(c.cmd(CMD_WRITE_ZEROES, base, 64 * K, CF_NO_HOLE), [0], "WRITE_ZEROES NO_HOLE")
    expect(c.cmd(CMD_WRITE_ZEROES, base + 64 * K, 64 * K, CF_FUA), [0], "WRITE_ZEROES FUA")
    check(c.read(base, 128 * K).data == b"\0" * (128 * K), "zeroed range")
    if c.tflags & TF_SEND_FAST_ZERO:
        r = c.cmd(CMD_WRITE_ZEROES, base + 128 * K, 64 * K, CF_FAST_ZERO)
        expect(r, [0, ENOTSUP], "FAST_ZERO")
        want = b"\0" * (64 * K) if r.error == 0 else pat[128 * K:192 * K]
        check(c.read(base + 128 * K, 64 * K).data == want, "after FAST_ZERO")
    else:
        expect(c.cmd(CMD_WRITE_ZEROES, base, 4096, CF_FAST_ZERO), [EINVAL], "FAST_ZERO")
    if c.tflags & TF_SEND_TRIM:
        expect(c.cmd(CMD_TRIM, base + 192 * K, 64 * K), [0], "TRIM")
    if c.tflags & TF_SEND_CACHE:
        expect(c.cmd(CMD_CACHE, 0, M), [0], "CACHE")
        expect(c.cmd(CMD_CACHE, 0, M, CF_DF), [EINVAL], "CACHE with DF")


def t_extended(h):
    c = h.connect(ext=True)
    check(c.read(0, 65536).data == h.canary[:65536], "extended read")
    base = 6 * M
    pat = h.rng.randbytes(128 * K)
    expect(c.write(base, pat), [0], "extended write")
    check(c.read(base, len(pat)).data == pat, "extended write content")
    # WRITE without PAYLOAD_LEN: no payload follows; the server must refuse it.
    expect(c.cmd(CMD_WRITE, base, 4096), [EINVAL], "extended WRITE without PAYLOAD_LEN")
    # A payload on a command without one is consumed, then refused.
    junk = struct.pack(">IHHQQQ", EXT_REQUEST_MAGIC, 0, CMD_WRITE, 5, 0, 0) * 128
    expect(c.cmd(0x60, 0, len(junk), CF_PAYLOAD_LEN, junk), [EINVAL], "unknown cmd + payload")
    expect(c.cmd(CMD_READ, 0, len(junk), CF_PAYLOAD_LEN, junk), [EINVAL], "READ + payload")
    # 64-bit lengths.
    expect(c.read(0, 1 << 33), [EINVAL, EOVERFLOW], "READ of 8 GiB")
    expect(c.cmd(CMD_TRIM, 0, 1 << 40), [EINVAL, ENOSPC], "TRIM of 1 TiB")
    expect(c.cmd(CMD_WRITE_ZEROES, 1 << 62, 1 << 62), [ENOSPC, EINVAL], "WRITE_ZEROES 2^62")
    r = c.cmd(CMD_BLOCK_STATUS, 0, c.size, CF_REQ_ONE)
    expect(r, [0], "BLOCK_STATUS_EXT")
    r = c.cmd(CMD_BLOCK_STATUS, 0, 1 << 40)
    expect(r, [EINVAL, 0], "BLOCK_STATUS of 1 TiB")
    check(c.read(base, len(pat)).data == pat, "data after refused extended requests")
    # Payload announced beyond any maximum: the server SHOULD disconnect (or refuse it).
    c.send(struct.pack(">IHHQQQ", EXT_REQUEST_MAGIC, CF_PAYLOAD_LEN, CMD_WRITE, 6, 0, 1 << 40))
    try:
        magic = c.recv(4)
        check(struct.unpack(">I", magic)[0] == EXT_REPLY_MAGIC, "reply to 1 TiB payload")
    except Closed:
        pass
    c.close()
    # A compact header after extended headers were negotiated is a bad magic.
    c = h.connect(ext=True)
    c.send(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, CMD_READ, 1, 0, 512) + b"\0" * 8)
    c.expect_close("compact request with extended headers")


CASES = [(f.__name__, f) for f in (
    h_bad_client_flags, h_no_zeroes_not_offered, h_bad_option_magic, h_unknown_option,
    h_many_options, h_info_missing, h_go_missing, h_go_bad_lengths, h_oversized_option,
    h_list, h_structured_and_starttls, h_meta_contexts, h_no_meta_block_status,
    h_export_name, h_extended_then_structured, h_abort_and_truncated, h_idle_connections,
    t_bad_magic, t_garbage, t_unknown_command, t_unknown_flags, t_past_end,
    t_oversized_write, ro_readonly, t_truncated_requests, t_pipeline, t_disc_with_inflight,
    t_structured_read, t_simple_replies, t_block_status, t_zero_length, t_flush_and_friends,
    t_extended)]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="unix socket of a running server (default: start "
                    "$IOPLANE serve with the epoll loop backend)")
    ap.add_argument("--export", default="w", help="writable export, at least 16 MiB, "
                    "sparse at [8M, 12M)")
    ap.add_argument("--ro-export", default="ro", help="read-only export")
    ap.add_argument("--pid", type=int, default=0, help="daemon pid (checked alive)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per reply")
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the cases")
    return ap.parse_args()


def listening(path):
    # /proc/net/unix flag 00010000: listen() was called (no probe connection needed).
    with open("/proc/net/unix") as f:
        return any(ln.split()[-1] == path and ln.split()[3] == "00010000"
                   for ln in f.readlines()[1:] if len(ln.split()) >= 8)


def standalone(args):
    """Without --socket (as the test runner runs tests/func/*.py): start the daemon like
    test-nbd-hostile.sh does, but on the epoll loop backend, so that the two runs cover
    both loop backends; stop it with SIGTERM and require exit status 0."""
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ioplane = os.environ.get("IOPLANE") or os.path.join(
        os.environ.get("IOPLANE_BUILD") or os.path.join(src, "build"), "ioplane")
    if not os.access(ioplane, os.X_OK):
        print("FAIL: no executable ioplane at %s" % ioplane)
        return 1
    with tempfile.TemporaryDirectory(prefix="ioplane-hostile.") as tmp:
        w, ro, args.socket = tmp + "/w.img", tmp + "/ro.img", tmp + "/nbd.sock"
        with open(w, "wb") as f:
            f.truncate(16 * M)
        with open(ro, "wb") as f:
            f.write(b"\x3c" * (4 * M))
        env = dict(os.environ, IOPLANE_LOOP_BACKEND="epoll")
        log = open(tmp + "/serve.log", "w+")
        p = subprocess.Popen([ioplane, "serve", "--image", "w,file=" + w,
                              "--image", "r,file=%s,read-only=on" % ro,
                              "--nbd", "unix=%s,image=w,writable=on" % args.socket,
                              "--nbd", "unix=%s,image=r,name=ro" % args.socket],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        try:
            for _ in range(600):
                if listening(args.socket) or p.poll() is not None:
                    break
                time.sleep(0.05)
            ok = listening(args.socket)
            if not ok:
                print("FAIL: the daemon did not start")
            else:
                args.pid = p.pid
                ok = run(args)
                p.terminate()
                rc = p.wait(30)
                if rc != 0:
                    print("FAIL: daemon exit status %d after SIGTERM" % rc)
                    ok = False
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.seek(0)
            if not ok:
                print("---- server log\n" + log.read()[-3000:])
            log.close()
        with open(ro, "rb") as f:
            if f.read() != b"\x3c" * (4 * M):
                print("FAIL: the read-only image changed")
                ok = False
    return 0 if ok else 1


def run(args):
    random.seed(args.seed)
    h = Harness(args)
    ok = h.run(CASES)
    print("%s: %d failed" % ("PASS" if ok else "FAIL", len(h.failures)))
    if h.failures:
        print("failed: " + " ".join(h.failures))
    return ok


def main():
    args = parse_args()
    if args.list:
        print("\n".join(n for n, _ in CASES))
        return 0
    if not args.socket:
        return standalone(args)
    return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
