"""NBD protocol client for tests (imported by nbd-hostile.py; stdlib only).

A connection driven by hand, one message at a time, that validates everything the
server sends against doc/proto.md of the NetworkBlockDevice/nbd project: option reply
layout, NBD_REP_INFO sizes, transmission flags, simple / structured / extended reply
headers, chunk types and their bounds, block status descriptors, error values. A rule
broken by the server raises Failure; a closed connection raises Closed.
The leading underscore keeps the test runner (scripts/test.sh) from running it as a test.
"""

import random
import socket
import struct
import time

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
OPT_REPLY_MAGIC = 0x3E889045565A9
REQUEST_MAGIC = 0x25609513
EXT_REQUEST_MAGIC = 0x21E41C71
SIMPLE_MAGIC = 0x67446698
STRUCTURED_MAGIC = 0x668E33EF
EXT_REPLY_MAGIC = 0x6E8A278C

FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1, 2
C_FIXED_NEWSTYLE, C_NO_ZEROES = 1, 2

(OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_STARTTLS, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY,
 OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS) = 1, 2, 3, 5, 6, 7, 8, 9, 10, 11

REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT = 1, 2, 3, 4
E = 1 << 31
REP_ERR = {E + 1: "UNSUP", E + 2: "POLICY", E + 3: "INVALID", E + 4: "PLATFORM",
           E + 5: "TLS_REQD", E + 6: "UNKNOWN", E + 7: "SHUTDOWN", E + 8: "BLOCK_SIZE_REQD",
           E + 9: "TOO_BIG", E + 10: "EXT_HEADER_REQD"}
ERR_UNSUP, ERR_POLICY, ERR_INVALID, ERR_UNKNOWN = E + 1, E + 2, E + 3, E + 6
ERR_TLS_REQD, ERR_TOO_BIG, ERR_EXT_HEADER_REQD = E + 5, E + 9, E + 10

INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 0, 1, 2, 3

TF_HAS_FLAGS, TF_READ_ONLY, TF_SEND_FLUSH, TF_SEND_FUA = 1, 2, 4, 8
TF_SEND_TRIM, TF_SEND_WRITE_ZEROES, TF_SEND_DF = 1 << 5, 1 << 6, 1 << 7
TF_CAN_MULTI_CONN, TF_SEND_CACHE, TF_SEND_FAST_ZERO = 1 << 8, 1 << 10, 1 << 11
TF_BLOCK_STATUS_PAYLOAD = 1 << 12

CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM = 0, 1, 2, 3, 4
CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 5, 6, 7
CF_FUA, CF_NO_HOLE, CF_DF, CF_REQ_ONE, CF_FAST_ZERO, CF_PAYLOAD_LEN = 1, 2, 4, 8, 16, 32

REPLY_FLAG_DONE = 1
RT_NONE, RT_OFFSET_DATA, RT_OFFSET_HOLE = 0, 1, 2
RT_BLOCK_STATUS, RT_BLOCK_STATUS_EXT = 5, 6
RT_ERROR, RT_ERROR_OFFSET = (1 << 15) + 1, (1 << 15) + 2

EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN = 1, 5, 12, 22, 28, 75, 95, 108
NBD_ERRNO = {EPERM: "EPERM", EIO: "EIO", ENOMEM: "ENOMEM", EINVAL: "EINVAL",
             ENOSPC: "ENOSPC", EOVERFLOW: "EOVERFLOW", ENOTSUP: "ENOTSUP",
             ESHUTDOWN: "ESHUTDOWN"}

K, M = 1 << 10, 1 << 20
MAX_OPT_REPLY = 64 * K          # no sane option reply is larger (strings are <= 4096)


class Failure(Exception):
    """The server broke a rule of the protocol (or of this test)."""


class Closed(Exception):
    """The server closed (or reset) the connection."""


def errname(e):
    return NBD_ERRNO.get(e, str(e)) if e else "success"


def repname(r):
    return REP_ERR.get(r, {1: "ACK", 2: "SERVER", 3: "INFO", 4: "META_CONTEXT"}.get(r, hex(r)))


def check(cond, msg):
    if not cond:
        raise Failure(msg)


class Result:
    """Everything the server sent in reply to one request."""

    def __init__(self, req):
        self.req = req            # (cmd, flags, offset, length)
        self.error = 0
        self.data = None
        self.covered = []         # read content chunks: (start, end)
        self.holes = 0
        self.content_chunks = 0
        self.extents = {}         # context id -> [(length, status)]
        self.chunks = []          # (type, flags)
        self.simple = False


class Conn:
    """One client connection, driven by hand; every server message is validated."""

    def __init__(self, args, timeout=None):
        self.args = args
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.timeout = timeout or args.timeout
        self.s.settimeout(self.timeout)
        self.s.connect(args.socket)
        self.structured = False
        self.ext = False
        self.contexts = {}        # id -> name
        self.size = None
        self.tflags = 0
        self.hflags = 0
        self.pending = {}         # cookie -> Result
        self.done = {}            # cookie -> Result, complete but not yet waited for
        self.next_cookie = random.getrandbits(48) | 1

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass

    # -- bytes --------------------------------------------------------------------------
    def send(self, b):
        try:
            self.s.sendall(b)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed("send: %s" % e)

    def recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                c = self.s.recv(min(n - len(buf), 4 * M))
            except socket.timeout:
                raise Failure("server silent for %ss (wanted %d more bytes): hung?"
                              % (self.timeout, n - len(buf)))
            except ConnectionResetError:
                raise Closed("reset")
            if not c:
                raise Closed("EOF after %d of %d bytes" % (len(buf), n))
            buf += c
        return bytes(buf)

    def expect_close(self, what):
        """The server must close the connection (anything it sends first is ignored)."""
        got = 0
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                c = self.s.recv(64 * K)
            except socket.timeout:
                break
            except ConnectionResetError:
                return
            if not c:
                return
            got += len(c)
            check(got < 64 * M, "%s: server keeps sending instead of closing" % what)
        raise Failure("%s: server did not close the connection within %ss"
                      % (what, self.timeout))

    # -- handshake ----------------------------------------------------------------------
    def greet(self):
        magic, opt, hflags = struct.unpack(">QQH", self.recv(18))
        check(magic == NBDMAGIC, "bad NBDMAGIC %#x" % magic)
        check(opt == IHAVEOPT, "not newstyle: %#x" % opt)
        check(hflags & FLAG_FIXED_NEWSTYLE, "server does not set FIXED_NEWSTYLE")
        check(hflags & ~3 == 0, "server sets unknown handshake flags %#x" % hflags)
        self.hflags = hflags

    def handshake(self, no_zeroes=True):
        self.greet()
        cf = C_FIXED_NEWSTYLE
        if no_zeroes and self.hflags & FLAG_NO_ZEROES:
            cf |= C_NO_ZEROES
        self.send(struct.pack(">I", cf))
        self.no_zeroes = bool(cf & C_NO_ZEROES)

    def opt(self, opt, data=b"", length=None):
        ln = len(data) if length is None else length
        self.send(struct.pack(">QII", IHAVEOPT, opt, ln) + data)

    def opt_reply(self, opt):
        magic, o, rtype, ln = struct.unpack(">QIII", self.recv(20))
        check(magic == OPT_REPLY_MAGIC, "option reply magic %#x" % magic)
        check(o == opt, "option reply for option %d, sent %d" % (o, opt))
        check(ln <= MAX_OPT_REPLY, "option reply of %d bytes" % ln)
        data = self.recv(ln)
        if rtype & E:
            check(rtype in REP_ERR, "unknown option error %#x" % rtype)
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise Failure("error message is not UTF-8: %r" % data[:64])
        return rtype, data

    def opt_expect(self, opt, data, allowed, what, length=None):
        self.opt(opt, data, length)
        rtype, _ = self.opt_reply(opt)
        check(rtype in allowed, "%s: reply %s, expected %s"
              % (what, repname(rtype), "/".join(repname(a) for a in allowed)))
        return rtype

    def structured_reply(self):
        self.opt_expect(OPT_STRUCTURED_REPLY, b"", [REP_ACK], "STRUCTURED_REPLY")
        self.structured = True

    def extended_headers(self):
        self.opt_expect(OPT_EXTENDED_HEADERS, b"", [REP_ACK], "EXTENDED_HEADERS")
        self.ext = True

    @staticmethod
    def meta_data(name, queries):
        nb = name.encode()
        d = struct.pack(">I", len(nb)) + nb + struct.pack(">I", len(queries))
        for q in queries:
            qb = q.encode()
            d += struct.pack(">I", len(qb)) + qb
        return d

    def meta(self, opt, name, queries):
        """LIST/SET_META_CONTEXT; returns (final reply type, {id: name})."""
        self.opt(opt, self.meta_data(name, queries))
        found = {}
        while True:
            rtype, d = self.opt_reply(opt)
            if rtype != REP_META_CONTEXT:
                return rtype, found
            check(len(d) >= 5, "META_CONTEXT reply of %d bytes" % len(d))
            cid = struct.unpack(">I", d[:4])[0]
            cname = d[4:].decode("utf-8")
            check(":" in cname, "context name without a namespace: %r" % cname)
            if opt == OPT_SET_META_CONTEXT:
                check(cid not in found, "context id %d given twice" % cid)
            found[cid] = cname

    def set_meta(self, name, queries=("base:allocation",)):
        rtype, found = self.meta(OPT_SET_META_CONTEXT, name, list(queries))
        check(rtype == REP_ACK, "SET_META_CONTEXT: %s" % repname(rtype))
        self.contexts = found
        return found

    def info(self, name, infos=(), go=False):
        """INFO or GO; returns (final reply type, {info type: payload})."""
        opt = OPT_GO if go else OPT_INFO
        nb = name.encode()
        d = struct.pack(">I", len(nb)) + nb + struct.pack(">H", len(infos))
        d += b"".join(struct.pack(">H", i) for i in infos)
        self.opt(opt, d)
        got = {}
        while True:
            rtype, d = self.opt_reply(opt)
            if rtype != REP_INFO:
                break
            check(len(d) >= 2, "NBD_REP_INFO of %d bytes" % len(d))
            it = struct.unpack(">H", d[:2])[0]
            want = {INFO_EXPORT: 12, INFO_BLOCK_SIZE: 14}.get(it)
            check(want is None or len(d) == want, "info %d of length %d" % (it, len(d)))
            check(it not in got, "info type %d sent twice" % it)
            got[it] = d[2:]
        if rtype == REP_ACK:
            check(INFO_EXPORT in got, "ACK without NBD_INFO_EXPORT")
            size, tf = struct.unpack(">QH", got[INFO_EXPORT])
            self.check_tflags(tf)
            if INFO_BLOCK_SIZE in got:
                check_block_size(got[INFO_BLOCK_SIZE])
            if go:
                self.size, self.tflags = size, tf
        return rtype, got

    def check_tflags(self, tf):
        check(tf & TF_HAS_FLAGS, "transmission flags without HAS_FLAGS: %#x" % tf)
        if not (self.structured or self.ext):
            check(not tf & TF_SEND_DF, "SEND_DF without structured replies")
        if not tf & TF_SEND_WRITE_ZEROES:
            check(not tf & TF_SEND_FAST_ZERO, "SEND_FAST_ZERO without SEND_WRITE_ZEROES")
        if not self.ext:
            check(not tf & TF_BLOCK_STATUS_PAYLOAD, "BLOCK_STATUS_PAYLOAD without ext hdrs")

    def go(self, name, infos=(INFO_BLOCK_SIZE,)):
        rtype, got = self.info(name, infos, go=True)
        check(rtype == REP_ACK, "GO %r: %s" % (name, repname(rtype)))
        return got

    # -- transmission -------------------------------------------------------------------
    def request(self, cmd, offset=0, length=0, flags=0, data=b"", cookie=None, magic=None):
        if cookie is None:
            cookie = self.next_cookie
            self.next_cookie += 1
        if self.ext:
            hdr = struct.pack(">IHHQQQ", magic or EXT_REQUEST_MAGIC, flags, cmd, cookie,
                              offset, length)
        else:
            hdr = struct.pack(">IHHQQI", magic or REQUEST_MAGIC, flags, cmd, cookie, offset,
                              length)
        check(cookie not in self.pending, "test bug: cookie reused")
        self.done.pop(cookie, None)
        self.pending[cookie] = Result((cmd, flags, offset, length))
        self.send(hdr + data)
        return cookie

    def one_reply(self):
        """Read and validate one reply message; returns (cookie, done)."""
        magic = struct.unpack(">I", self.recv(4))[0]
        if magic == SIMPLE_MAGIC:
            return self.simple_reply()
        if magic == STRUCTURED_MAGIC:
            check(self.structured and not self.ext, "structured reply not negotiated")
            flags, rtype, cookie, ln = struct.unpack(">HHQI", self.recv(16))
            roff = None
        elif magic == EXT_REPLY_MAGIC:
            check(self.ext, "extended reply without extended headers")
            flags, rtype, cookie, roff, ln = struct.unpack(">HHQQQ", self.recv(28))
        else:
            raise Failure("reply magic %#x" % magic)
        check(cookie in self.pending, "reply for unknown cookie %#x" % cookie)
        res = self.pending[cookie]
        check(ln <= 64 * M, "chunk payload of %d bytes" % ln)
        if roff is not None:
            check(roff == res.req[2], "extended reply offset %d, request %d"
                  % (roff, res.req[2]))
        check(flags & ~REPLY_FLAG_DONE == 0, "unknown reply flags %#x" % flags)
        self.chunk(res, rtype, flags, self.recv(ln))
        if flags & REPLY_FLAG_DONE:
            del self.pending[cookie]
            self.done[cookie] = res
            self.finish(res)
        return cookie, bool(flags & REPLY_FLAG_DONE)

    def simple_reply(self):
        check(not self.ext, "simple reply with extended headers negotiated")
        err, cookie = struct.unpack(">IQ", self.recv(12))
        check(cookie in self.pending, "simple reply for unknown cookie %#x" % cookie)
        res = self.pending.pop(cookie)
        self.done[cookie] = res
        cmd, _, _, length = res.req
        check(res.chunks == [], "simple reply after structured chunks")
        if self.structured:
            check(cmd != CMD_READ, "simple reply to READ with structured replies")
        check_errno(err)
        res.error, res.simple = err, True
        if cmd == CMD_READ and err == 0:
            res.data = bytearray(self.recv(length))
            res.covered = [(0, length)]
        return cookie, True

    def chunk(self, res, rtype, flags, p):
        cmd, rflags, off, length = res.req
        res.chunks.append((rtype, flags))
        if rtype == RT_NONE:
            check(len(p) == 0 and flags & REPLY_FLAG_DONE, "bad NBD_REPLY_TYPE_NONE")
        elif rtype in (RT_OFFSET_DATA, RT_OFFSET_HOLE):
            check(cmd == CMD_READ, "content chunk for command %d" % cmd)
            if rtype == RT_OFFSET_DATA:
                check(len(p) >= 9, "OFFSET_DATA of length %d" % len(p))
                coff, n = struct.unpack(">Q", p[:8])[0], len(p) - 8
            else:
                check(len(p) == 12, "OFFSET_HOLE of length %d" % len(p))
                coff, n = struct.unpack(">QI", p)
                check(n > 0, "empty hole")
                res.holes += 1
            check(off <= coff and coff + n <= off + length,
                  "content chunk [%d,+%d) outside request [%d,+%d)" % (coff, n, off, length))
            rel = coff - off
            for a, b in res.covered:
                check(rel >= b or rel + n <= a, "overlapping content chunks")
            res.covered.append((rel, rel + n))
            res.content_chunks += 1
            if res.data is None:
                res.data = bytearray(length)
            if rtype == RT_OFFSET_DATA:
                res.data[rel:rel + n] = p[8:]
        elif rtype in (RT_BLOCK_STATUS, RT_BLOCK_STATUS_EXT):
            self.status_chunk(res, rtype, p)
        elif rtype in (RT_ERROR, RT_ERROR_OFFSET):
            fixed = 6 if rtype == RT_ERROR else 14
            check(len(p) >= fixed, "error chunk of length %d" % len(p))
            err, mlen = struct.unpack(">IH", p[:6])
            check(err != 0, "error chunk with error 0")
            check_errno(err)
            check(mlen <= len(p) - fixed, "error message length %d > %d" % (mlen, len(p)))
            try:
                p[6:6 + mlen].decode("utf-8")
            except UnicodeDecodeError:
                raise Failure("error message not UTF-8")
            if rtype == RT_ERROR_OFFSET:
                eoff = struct.unpack(">Q", p[6 + mlen:14 + mlen])[0]
                check(off <= eoff < off + max(length, 1), "error offset outside request")
            res.error = res.error or err
        else:
            raise Failure("unknown chunk type %d" % rtype)

    def status_chunk(self, res, rtype, p):
        cmd, rflags, off, length = res.req
        check(cmd == CMD_BLOCK_STATUS, "status chunk for command %d" % cmd)
        if rtype == RT_BLOCK_STATUS:
            check(not self.ext, "32-bit BLOCK_STATUS chunk with extended headers")
            check(len(p) >= 12 and (len(p) - 4) % 8 == 0, "BLOCK_STATUS length %d" % len(p))
            cid = struct.unpack(">I", p[:4])[0]
            ext = [struct.unpack(">II", p[i:i + 8]) for i in range(4, len(p), 8)]
        else:
            check(self.ext, "BLOCK_STATUS_EXT without extended headers")
            check(len(p) >= 24 and (len(p) - 8) % 16 == 0, "BLOCK_STATUS_EXT len %d" % len(p))
            cid, count = struct.unpack(">II", p[:8])
            ext = [struct.unpack(">QQ", p[i:i + 16]) for i in range(8, len(p), 16)]
            check(count == len(ext), "descriptor count %d for %d" % (count, len(ext)))
            for _, st in ext:
                check(st >> 32 == 0, "base:allocation status with high bits %#x" % st)
        check(cid in self.contexts, "status for context id %d not negotiated" % cid)
        check(cid not in res.extents, "two status chunks for context %d" % cid)
        check(all(n > 0 for n, _ in ext), "zero-length extent")
        if rflags & CF_REQ_ONE:
            check(len(ext) == 1, "REQ_ONE answered with %d extents" % len(ext))
            check(ext[0][0] <= length, "REQ_ONE extent longer than the request")
        elif length:
            check(sum(n for n, _ in ext[:-1]) < length, "extents after the requested range")
        res.extents[cid] = ext

    def finish(self, res):
        cmd, rflags, off, length = res.req
        if res.error or cmd != CMD_READ:
            if cmd == CMD_BLOCK_STATUS and not res.error:
                check(set(res.extents) == set(self.contexts),
                      "status chunks for %s, negotiated %s"
                      % (sorted(res.extents), sorted(self.contexts)))
            return
        # A successful structured read covers the whole request exactly once.
        check(sum(b - a for a, b in res.covered) == length,
              "read chunks cover %d of %d bytes" % (sum(b - a for a, b in res.covered), length))
        if rflags & CF_DF:
            check(res.content_chunks <= 1, "DF read in %d chunks" % res.content_chunks)
        if res.data is None:
            res.data = bytearray(length)

    def wait(self, cookie):
        """Replies until the one for cookie is complete (others are kept)."""
        check(cookie in self.pending or cookie in self.done, "test bug: unknown cookie")
        while cookie in self.pending:
            self.one_reply()
        return self.done.pop(cookie)

    def cmd(self, cmd, offset=0, length=0, flags=0, data=b""):
        return self.wait(self.request(cmd, offset, length, flags, data))

    def write(self, offset, data, flags=0):
        if self.ext:
            flags |= CF_PAYLOAD_LEN
        return self.cmd(CMD_WRITE, offset, len(data), flags, data)

    def read(self, offset, length, flags=0):
        return self.cmd(CMD_READ, offset, length, flags)


def check_errno(err):
    check(err == 0 or err in NBD_ERRNO, "error value %d is not an NBD error" % err)


def check_block_size(p):
    mn, pref, mx = struct.unpack(">III", p)
    check(mn and mn & (mn - 1) == 0 and mn <= 64 * K, "minimum block size %d" % mn)
    check(pref & (pref - 1) == 0 and pref >= max(mn, 512), "preferred block size %d" % pref)
    check(mx >= pref, "maximum payload %d < preferred %d" % (mx, pref))


def expect(res, allowed, what):
    check(res.error in allowed, "%s: got %s, expected %s"
          % (what, errname(res.error), "/".join(errname(a) for a in allowed)))
