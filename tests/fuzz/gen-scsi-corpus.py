#!/usr/bin/env python3
"""Seeds for fuzz-scsi (see tests/fuzz/fuzz-scsi.c for the input layout): one request
chain for every command ioplane answers, plus control and event queue chains.
Usage: gen-scsi-corpus.py DIR"""
import hashlib
import os
import struct
import sys


def seed(flags, queue, nout, nin, lens, body):
    head = bytes([flags, queue, (nout - 1) | (nin - 1) << 4]) + bytes(lens).ljust(16, b'\0')
    return head + body


def cmd(cdb, data=b''):
    return bytes([1, 0, 0x40, 0, 0, 0, 0, 0]) + bytes(11) + cdb.ljust(32, b'\0') + data


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cdbs = [bytes(6), bytes([0x12, 0, 0, 0, 96, 0]), bytes([0x12, 1, 0xb0, 0, 96, 0]),
            bytes([0x12, 1, 0x83, 0, 96, 0]), bytes([0xa0] + [0] * 7 + [1, 0, 0, 0]),
            bytes([0x25] + [0] * 9), bytes([0x9e, 0x10] + [0] * 11 + [32, 0, 0]),
            struct.pack('>BBIBHB', 0x28, 0, 1, 0, 1, 0), struct.pack('>BBIBHB', 0x2a, 8, 1, 0, 1, 0),
            struct.pack('>BBQIBB', 0x88, 0, 2, 1, 0, 0), bytes([0x35] + [0] * 9),
            struct.pack('>BBQIBB', 0x93, 8, 0, 4, 0, 0), bytes([0x1a, 0, 0x3f, 0, 255, 0]),
            bytes([0x5a, 8, 8, 0, 0, 0, 0, 0, 255, 0]), bytes([0x03, 0, 0, 0, 18, 0])]
    seeds = []
    for c in cdbs:
        # header of 51 bytes over two iovecs (49 + 513), response 113, data-in 513
        seeds.append(seed(7, 2, 2, 2, [3, 32, 7, 32], cmd(c, bytes(512))))
        seeds.append(seed(7, 2, 1, 2, [3, 7, 32], cmd(c)))
    plist = struct.pack('>HHI', 22, 16, 0) + struct.pack('>QII', 1, 4, 0)
    seeds.append(seed(7, 2, 2, 1, [3, 1, 7], cmd(bytes([0x42] + [0] * 6 + [0, 24, 0]), plist)))
    tmf = struct.pack('<II', 0, 5) + bytes([1, 0, 0x40, 0, 0, 0, 0, 0]) + bytes(8)
    seeds.append(seed(0, 0, 2, 1, [1, 0, 0], tmf))
    seeds.append(seed(0, 1, 1, 1, [0, 1], b''))
    for s in seeds:
        with open(os.path.join(out, hashlib.sha1(s).hexdigest()), 'wb') as f:
            f.write(s)


if __name__ == '__main__':
    main()
