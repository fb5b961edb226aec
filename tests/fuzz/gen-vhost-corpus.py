#!/usr/bin/env python3
"""Seeds for the vhost-user fuzz targets (run from anywhere; rewrites the corpora):
corpus-vhost-msg/: front-end message streams (QEMU's setup order, reconnects, resets,
memory slot changes, and malformed messages); corpus-vring/: guest memory images with
rings holding valid and hostile descriptor chains (see tests/fuzz/fuzz-vring.c)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- vhost-user messages -------------------------------------------------------------
(GET_FEATURES, SET_FEATURES, SET_OWNER, RESET_OWNER, SET_MEM_TABLE, SET_LOG_BASE, _7,
 SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE, SET_VRING_KICK,
 SET_VRING_CALL, SET_VRING_ERR, GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES,
 GET_QUEUE_NUM, SET_VRING_ENABLE) = range(1, 19)
GET_CONFIG, SET_CONFIG, GET_INFLIGHT_FD, SET_INFLIGHT_FD = 24, 25, 31, 32
RESET_DEVICE, GET_MAX_MEM_SLOTS, ADD_MEM_REG, REM_MEM_REG = 34, 36, 37, 38
NEED_REPLY = 8
PF = (1 << 0) | (1 << 3) | (1 << 9) | (1 << 12) | (1 << 13) | (1 << 15)
FEAT = (1 << 32) | (1 << 30) | (1 << 29) | (1 << 28) | (1 << 9)
UVA = 0x7f0000000000
MEM = 1 << 20


def msg(req, payload=b'', flags=1):
    return struct.pack('<III', req, flags, len(payload)) + payload


def u64(v):
    return struct.pack('<Q', v)


def state(i, n):
    return struct.pack('<II', i, n)


def region(gpa, size, uva, off=0):
    return struct.pack('<QQQQ', gpa, size, uva, off)


def mem_table(regions):
    return struct.pack('<II', len(regions), 0) + b''.join(regions)


def queue(i, num=64, base=0, nofd_call=False):
    d = i * 0x4000
    addr = struct.pack('<IIQQQQ', i, 0, UVA + d, UVA + d + 0x2000, UVA + d + 0x1000, 0)
    return (msg(SET_VRING_NUM, state(i, num)) + msg(SET_VRING_BASE, state(i, base)) +
            msg(SET_VRING_ADDR, addr) + msg(SET_VRING_KICK, u64(i)) +
            msg(SET_VRING_CALL, u64(i | (0x100 if nofd_call else 0))))


def setup(nq=2, ack=False):
    f = NEED_REPLY | 1 if ack else 1
    s = (msg(GET_FEATURES) + msg(GET_PROTOCOL_FEATURES) + msg(SET_PROTOCOL_FEATURES, u64(PF)) +
         msg(GET_QUEUE_NUM) + msg(SET_OWNER) +
         msg(GET_CONFIG, struct.pack('<III', 0, 60, 0) + bytes(60)) +
         msg(SET_FEATURES, u64(FEAT), f) +
         msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA)]), f))
    for i in range(nq):
        s += queue(i)
    for i in range(nq):
        s += msg(SET_VRING_ENABLE, state(i, 1), f)
    return s


def inflight(nq=2, num=64):
    size = nq * ((16 + 16 * num + 63) & ~63)
    return (msg(GET_INFLIGHT_FD, struct.pack('<QQHH', 0, 0, nq, num) + bytes(4)) +
            msg(SET_INFLIGHT_FD, struct.pack('<QQHH', size, 0, nq, num) + bytes(4)))


def stop(nq=2):
    return b''.join(msg(GET_VRING_BASE, state(i, 0)) for i in range(nq))


MSG_SEEDS = {
    'setup-1q': setup(1),
    'setup-4q-ack': setup(4, True),
    'setup-stop': setup(2) + stop(2),
    'setup-inflight': (msg(GET_FEATURES) + msg(SET_PROTOCOL_FEATURES, u64(PF)) +
                       msg(SET_FEATURES, u64(FEAT)) +
                       msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA)])) + inflight(2) +
                       queue(0) + queue(1) + msg(SET_VRING_ENABLE, state(0, 1)) +
                       msg(SET_VRING_ENABLE, state(1, 1)) + stop(2)),
    'restart-rings': setup(2) + stop(2) + queue(0, base=5) + queue(1, base=9),
    'reset-device': setup(2) + msg(RESET_DEVICE) + setup(1),
    'reset-owner': setup(2) + msg(RESET_OWNER) + stop(2),
    'mem-slots': (msg(SET_PROTOCOL_FEATURES, u64(PF)) + msg(GET_MAX_MEM_SLOTS) +
                  msg(ADD_MEM_REG, bytes(8) + region(0, MEM // 2, UVA)) +
                  msg(ADD_MEM_REG, bytes(8) + region(MEM // 2, MEM // 2, UVA + MEM // 2)) +
                  queue(0) + msg(SET_VRING_ENABLE, state(0, 1)) +
                  msg(REM_MEM_REG, bytes(8) + region(MEM // 2, MEM // 2, UVA + MEM // 2)) +
                  stop(1)),
    'mem-change-running': setup(2) + msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA + MEM)])),
    'call-change-running': setup(2) + msg(SET_VRING_CALL, u64(1)) + msg(SET_VRING_CALL, u64(0x101)),
    'config': (msg(SET_PROTOCOL_FEATURES, u64(PF)) +
               msg(GET_CONFIG, struct.pack('<III', 0, 256, 0) + bytes(256)) +
               msg(GET_CONFIG, struct.pack('<III', 250, 10, 0) + bytes(10)) +
               msg(SET_CONFIG, struct.pack('<III', 32, 1, 0) + b'\x00', NEED_REPLY | 1) +
               msg(SET_CONFIG, struct.pack('<III', 0, 8, 0) + bytes(8), NEED_REPLY | 1)),
    'bad-size': msg(SET_FEATURES, b'\x01\x02\x03'),
    'bad-version': msg(GET_FEATURES, flags=2),
    'bad-index': msg(SET_VRING_NUM, state(300, 64)) + msg(SET_VRING_NUM, state(0, 100)),
    'bad-mem-table': (msg(SET_MEM_TABLE, mem_table([region(0, MEM * 4, UVA)])) +
                      msg(SET_MEM_TABLE, mem_table([region(2**64 - 4096, 8192, UVA)])) +
                      msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA), region(4096, 4096, UVA)]))),
    'bad-ring-addr': (msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA)])) +
                      msg(SET_VRING_NUM, state(0, 64)) +
                      msg(SET_VRING_ADDR, struct.pack('<IIQQQQ', 0, 0, UVA + MEM - 8, UVA, UVA, 0)) +
                      msg(SET_VRING_KICK, u64(0))),
    'bad-inflight': (msg(SET_PROTOCOL_FEATURES, u64(PF)) +
                     msg(SET_INFLIGHT_FD, struct.pack('<QQHH', 16, 0, 2, 64) + bytes(4)) +
                     msg(GET_INFLIGHT_FD, struct.pack('<QQHH', 0, 0, 0, 64) + bytes(4))),
    'unknown': msg(99) + msg(SET_LOG_BASE, u64(0)) + msg(GET_FEATURES),
    'oversized': struct.pack('<III', GET_FEATURES, 1, 1 << 20),
    'truncated': msg(SET_MEM_TABLE, mem_table([region(0, MEM, UVA)]))[:30],
}

# ---- guest memory for fuzz-vring --------------------------------------------------------
AVAIL, USED = 0x400, 0x800


def ring_image(num_log2, flags, descs, heads, extra=(), inflight=b''):
    mem = bytearray(0x4000)
    for i, (addr, ln, fl, nxt) in enumerate(descs):
        struct.pack_into('<QIHH', mem, 16 * i, addr, ln, fl, nxt)
    struct.pack_into('<HH', mem, AVAIL, 0, len(heads))
    for i, h in enumerate(heads):
        struct.pack_into('<H', mem, AVAIL + 4 + 2 * i, h)
    for off, data in extra:
        mem[off:off + len(data)] = data
    return bytes([num_log2, flags]) + bytes(mem) + inflight


def packed_image(num_log2, flags, descs, start=0, extra=()):
    """descs: (addr, len, id, flags) from slot `start` on, wrapping; the AVAIL
    bit of the device's wrap counter (1, flipped at the ring's end) is added."""
    mem = bytearray(0x4000)
    num = 1 << (num_log2 % 5)
    for i, (addr, ln, bid, fl) in enumerate(descs):
        s = start + i
        avail = 0x80 if (s // num) % 2 == 0 else 0x8000
        struct.pack_into('<QIHH', mem, 16 * (s % num), addr, ln, bid, fl | avail)
    for off, data in extra:
        mem[off:off + len(data)] = data
    return bytes([num_log2, flags | 0x10 | (start << 5)]) + bytes(mem)


def hdr(t, sector):
    return struct.pack('<IIQ', t, 0, sector)


N, W, I = 1, 2, 4
HDR, DATA, ST = 0x1000, 0x2000, 0x3ff0
VRING_SEEDS = {
    'read': ring_image(4, 1, [(HDR, 16, N, 1), (DATA, 4096, N | W, 2), (ST, 1, W, 0)], [0],
                       [(HDR, hdr(0, 8))]),
    'write-flush-getid': ring_image(4, 0, [(HDR, 16, N, 1), (DATA, 512, N, 2), (ST, 1, W, 0),
                                           (HDR + 16, 16, N, 4), (ST + 1, 1, W, 0),
                                           (HDR + 32, 16, N, 6), (DATA, 20, N | W, 7),
                                           (ST + 2, 1, W, 0)], [0, 3, 5],
                                    [(HDR, hdr(1, 0)), (HDR + 16, hdr(4, 0)),
                                     (HDR + 32, hdr(8, 0))]),
    'discard-wz': ring_image(3, 1, [(HDR, 32, N, 1), (ST, 1, W, 0), (HDR + 32, 32, N, 3),
                                    (ST + 1, 1, W, 0)], [0, 2],
                             [(HDR, hdr(11, 0) + struct.pack('<QII', 0, 8, 0)),
                              (HDR + 32, hdr(13, 0) + struct.pack('<QII', 8, 8, 1))]),
    'indirect': ring_image(2, 3, [(0x3000, 48, I, 0)], [0],
                           [(0x3000, struct.pack('<QIHHQIHHQIHH', HDR, 16, N, 1, DATA, 512,
                                                 N | W, 2, ST, 1, W, 0)),
                            (HDR, hdr(0, 0))]),
    'loop': ring_image(2, 0, [(HDR, 16, N, 1), (DATA, 0, N, 0)], [0]),
    'out-of-memory': ring_image(2, 0, [(0xfffffffffff0, 16, N, 1), (ST, 1, W, 0)], [0]),
    'sector-overflow': ring_image(2, 0, [(HDR, 16, N, 1), (DATA, 512, N | W, 2), (ST, 1, W, 0)],
                                  [0], [(HDR, hdr(0, 2**64 - 1))]),
    'no-status': ring_image(2, 0, [(HDR, 16, 0, 0)], [0], [(HDR, hdr(0, 0))]),
    'inflight': ring_image(3, 5, [(HDR, 16, N, 1), (DATA, 512, N | W, 2), (ST, 1, W, 0)], [0],
                           [(HDR, hdr(0, 0))],
                           struct.pack('<QHHHH', 0, 1, 8, 0, 0) +
                           struct.pack('<B5xHQ', 1, 0, 7) + bytes(16 * 7)),
    'packed-read': packed_image(3, 1, [(HDR, 16, 2, N), (DATA, 4096, 2, N | W), (ST, 1, 2, W),
                                       (HDR + 16, 16, 5, N), (DATA, 512, 5, N), (ST + 1, 1, 5, W)],
                                start=5, extra=[(HDR, hdr(0, 8)), (HDR + 16, hdr(1, 0))]),
    'packed-cross-region': packed_image(2, 0, [(HDR, 16, 0, N), (0x2f00, 512, 0, N | W),
                                               (ST, 1, 0, W)], extra=[(HDR, hdr(0, 0))]),
    'packed-indirect': packed_image(2, 3, [(0x3000, 48, 1, I)],
                                    extra=[(0x3000, struct.pack('<QIHHQIHHQIHH', HDR, 16, 0, 0,
                                                                DATA, 512, 0, W, ST, 1, 0, W)),
                                           (HDR, hdr(0, 0))]),
    'packed-long': packed_image(1, 0, [(HDR, 16, 0, N), (DATA, 16, 0, N), (ST, 1, 0, W)]),
}


def write(dirname, seeds):
    d = os.path.join(HERE, dirname)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), 'wb') as f:
            f.write(data)


write('corpus-vhost-msg', MSG_SEEDS)
write('corpus-vring', VRING_SEEDS)
