#!/usr/bin/env python3
"""Writes the seed corpus of the NBD fuzz target (tests/fuzz/corpus-nbd/).

Each file is the byte stream of one client connection, as nbd_fuzz_one() feeds it to
the server after its greeting: client flags, options, then (after GO/EXPORT_NAME)
requests. The fuzz server has a read-only 64 MiB export "null" and a writable 1 MiB
export "rw". Streams cover every option, every command and flag, structured replies and
extended headers, and malformed cases. Deterministic; small (a few KiB at most).

    python3 tests/fuzz/gen-nbd-corpus.py [DIR]     (default: corpus-nbd/ next to it)
"""

import os
import struct
import sys

IHAVEOPT = 0x49484156454F5054
REQ_MAGIC, EXT_REQ_MAGIC = 0x25609513, 0x21E41C71
C_FIXED, C_NO_ZEROES = 1, 2
(EXPORT_NAME, ABORT, LIST, STARTTLS, INFO, GO, STRUCTURED, LIST_META, SET_META,
 EXTENDED) = 1, 2, 3, 5, 6, 7, 8, 9, 10, 11
INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 0, 1, 2, 3
READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES, BLOCK_STATUS = range(8)
FUA, NO_HOLE, DF, REQ_ONE, FAST_ZERO, PAYLOAD_LEN = 1, 2, 4, 8, 16, 32
M = 1 << 20


def flags(f=C_FIXED | C_NO_ZEROES):
    return struct.pack(">I", f)


def opt(o, data=b"", length=None):
    return struct.pack(">QII", IHAVEOPT, o, len(data) if length is None else length) + data


def name_info(name, infos=()):
    nb = name.encode()
    return (struct.pack(">I", len(nb)) + nb + struct.pack(">H", len(infos)) +
            b"".join(struct.pack(">H", i) for i in infos))


def meta(name, queries):
    nb = name.encode()
    d = struct.pack(">I", len(nb)) + nb + struct.pack(">I", len(queries))
    for q in queries:
        d += struct.pack(">I", len(q)) + q.encode()
    return d


def go(name="rw", infos=(INFO_BLOCK_SIZE,)):
    return opt(GO, name_info(name, infos))


def req(cmd, off=0, ln=0, fl=0, cookie=1, data=b""):
    return struct.pack(">IHHQQI", REQ_MAGIC, fl, cmd, cookie, off, ln) + data


def ereq(cmd, off=0, ln=0, fl=0, cookie=1, data=b""):
    return struct.pack(">IHHQQQ", EXT_REQ_MAGIC, fl, cmd, cookie, off, ln) + data


def disc(ext=False):
    return (ereq if ext else req)(DISC, cookie=99)


def pattern(n, seed=1):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def structured_go(name="rw"):
    return flags() + opt(STRUCTURED) + opt(SET_META, meta(name, ["base:allocation"])) + go(name)


def extended_go(name="rw"):
    return flags() + opt(EXTENDED) + opt(SET_META, meta(name, ["base:allocation"])) + go(name)


def all_commands(r, ext=False):
    """One of each command on the writable export, as a well-behaved client sends them."""
    wfl = PAYLOAD_LEN if ext else 0
    return (r(WRITE, 4096, 512, wfl, 1, pattern(512)) + r(READ, 4096, 512, 0, 2) +
            r(WRITE, 8192, 512, wfl | FUA, 3, pattern(512, 2)) + r(FLUSH, 0, 0, 0, 4) +
            r(TRIM, 0, 4096, 0, 5) + r(WRITE_ZEROES, 16384, 8192, NO_HOLE, 6) +
            r(WRITE_ZEROES, 65536, 65536, FAST_ZERO, 7) + r(CACHE, 0, 65536, 0, 8) +
            r(BLOCK_STATUS, 0, M, 0, 9) + r(BLOCK_STATUS, 0, M, REQ_ONE, 10) +
            r(READ, 0, 65536, DF, 11) + disc(ext))


def corpus():
    c = {}
    # Handshake phase: each option alone, then the end of the negotiation.
    c["opt-abort"] = flags() + opt(ABORT)
    c["opt-list"] = flags() + opt(LIST) + opt(ABORT)
    c["opt-list-with-data"] = flags() + opt(LIST, b"junk") + opt(ABORT)
    c["opt-starttls"] = flags() + opt(STARTTLS) + opt(ABORT)
    c["opt-info-all"] = flags() + opt(INFO, name_info(
        "null", (INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 77))) + opt(ABORT)
    c["opt-info-missing"] = flags() + opt(INFO, name_info("nosuch")) + go("rw") + disc()
    c["opt-info-default"] = flags() + opt(INFO, name_info("")) + opt(ABORT)
    c["opt-go-missing-then-go"] = flags() + go("nosuch") + go("rw") + disc()
    c["opt-go-bad-namelen"] = flags() + opt(GO, struct.pack(">I", 500) + b"rw\0\0") + opt(ABORT)
    c["opt-go-short"] = flags() + opt(GO, b"\0\0") + opt(ABORT)
    c["opt-structured"] = flags() + opt(STRUCTURED) + opt(STRUCTURED, b"x") + opt(ABORT)
    c["opt-extended"] = flags() + opt(EXTENDED) + opt(STRUCTURED) + opt(ABORT)
    c["opt-list-meta"] = (flags() + opt(STRUCTURED) + opt(LIST_META, meta("rw", [])) +
                          opt(LIST_META, meta("rw", ["base:", "x-a:b"])) + opt(ABORT))
    c["opt-set-meta"] = (flags() + opt(STRUCTURED) +
                         opt(SET_META, meta("rw", ["base:allocation", "base:x", "qemu:y"])) +
                         opt(SET_META, meta("nosuch", ["base:allocation"])) + opt(ABORT))
    c["opt-set-meta-no-structured"] = flags() + opt(SET_META, meta("rw", ["base:allocation"]))
    c["opt-set-meta-truncated"] = (flags() + opt(STRUCTURED) +
                                   opt(SET_META, meta("rw", ["base:allocation"])[:-3]))
    c["opt-unknown"] = flags() + opt(0x1234, b"abc") + opt(4, b"") + opt(ABORT)
    c["opt-oversized"] = flags() + opt(GO, b"\0" * 16, length=0x7FFFFFFF)
    c["opt-bad-magic"] = flags() + struct.pack(">QII", 0x1122334455667788, GO, 0)
    c["opt-truncated"] = flags() + opt(GO, b"\0" * 10, length=40)
    c["flags-unknown"] = flags(0x80000001) + opt(ABORT)
    c["flags-none"] = flags(0) + opt(EXPORT_NAME, b"rw") + req(READ, 0, 512) + disc()
    c["export-name-rw"] = (flags(C_FIXED) + opt(EXPORT_NAME, b"rw") + req(READ, 0, 4096) +
                           req(WRITE, 0, 16, 0, 2, pattern(16)) + disc())
    c["export-name-missing"] = flags() + opt(EXPORT_NAME, b"nosuch")
    # Transmission phase, simple replies.
    c["simple-commands"] = flags() + go("rw") + all_commands(req)
    c["simple-read-null"] = flags() + go("null") + req(READ, 63 * M, M) + disc()
    c["simple-read-past-end"] = flags() + go("rw") + req(READ, M - 512, 1024) + disc()
    c["simple-block-status"] = flags() + go("rw") + req(BLOCK_STATUS, 0, 4096) + disc()
    # Structured replies.
    c["structured-commands"] = structured_go() + all_commands(req)
    c["structured-read-null"] = structured_go("null") + req(READ, 0, 2 * M) + disc()
    c["structured-readonly-writes"] = (structured_go("null") +
                                       req(WRITE, 0, 512, 0, 1, pattern(512)) +
                                       req(TRIM, 0, 4096, 0, 2) +
                                       req(WRITE_ZEROES, 0, 4096, 0, 3) + disc())
    c["structured-pipeline"] = structured_go() + b"".join(
        req(WRITE if i % 2 else READ, i * 4096, 512, 0, i,
            pattern(512, i) if i % 2 else b"") for i in range(16)) + disc()
    # Extended headers.
    c["extended-commands"] = extended_go() + all_commands(ereq, ext=True)
    c["extended-64bit"] = (extended_go("null") + ereq(READ, 0, 1 << 33) +
                           ereq(BLOCK_STATUS, 0, 1 << 40, 0, 2) +
                           ereq(TRIM, 1 << 62, 1 << 62, 0, 3) + disc(True))
    c["extended-payload-on-read"] = (extended_go() + ereq(READ, 0, 16, PAYLOAD_LEN, 1,
                                                          pattern(16)) + disc(True))
    c["extended-write-no-payload-len"] = extended_go() + ereq(WRITE, 0, 512) + disc(True)
    c["extended-compact-header"] = extended_go() + req(READ, 0, 512)
    # Malformed requests.
    c["req-bad-magic"] = flags() + go("rw") + struct.pack(">IHHQQI", 0xDEADBEEF, 0, 0, 1, 0, 8)
    c["req-unknown-cmd"] = structured_go() + req(0x42, 0, 512) + req(0xFFFF, 0, 512, 0, 2) + disc()
    c["req-unknown-flags"] = (structured_go() + req(READ, 0, 512, 1 << 12) +
                              req(WRITE, 0, 512, 1 << 9, 2, pattern(512)) + disc())
    c["req-overflow"] = (structured_go() + req(READ, (1 << 64) - 512, 1024) +
                         req(WRITE, (1 << 64) - 16, 32, 0, 2, pattern(32)) +
                         req(WRITE_ZEROES, M, 1 << 31, 0, 3) + disc())
    c["req-zero-length"] = structured_go() + b"".join(
        req(cmd, 512, 0, 0, cmd + 1) for cmd in (READ, WRITE, TRIM, CACHE, WRITE_ZEROES,
                                                  BLOCK_STATUS)) + disc()
    c["req-oversized-write"] = structured_go() + req(WRITE, 0, 0x02001000) + pattern(256)
    c["req-truncated"] = structured_go() + req(WRITE, 0, 4096, 0, 1, pattern(100))
    c["req-after-disc"] = structured_go() + disc() + req(READ, 0, 512)
    return c


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus-nbd")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(corpus().items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("%d inputs written to %s" % (len(corpus()), out))


if __name__ == "__main__":
    main()
