#!/usr/bin/env python3
"""Block-layer I/O errors are logged the same way by the NBD and the vhost-user-blk
export: the first 10 of a connection or queue, each with its operation, offset and
length, then, when the connection or queue ends, one line with the total.

The daemon runs with RLIMIT_FSIZE below its raw image's size and SIGXFSZ ignored, so
that every write past the limit fails with EFBIG. 15 such writes go through an NBD
connection and 15 through a virtqueue (the _vhostfe front-end); each gets its error
(NBD_ENOSPC, VIRTIO_BLK_S_IOERR), and the log must hold 10 lines of each and their
totals. Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import resource
import shutil
import signal
import struct
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nbdproto as nbd  # noqa: E402
from _vhostfe import MEM, Daemon, FrontEnd, Queue, fail, handshake  # noqa: E402
from _vhostfe import guest_memory  # noqa: E402
from _vhostfe import F_NEXT, F_WRITE, WAIT_S  # noqa: E402

LIMIT = 1 << 20
ERRORS = 15


def limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def nbd_writes(path):
    c = nbd.Conn(types.SimpleNamespace(socket=path, timeout=WAIT_S))
    c.handshake()
    c.go('n')
    for i in range(ERRORS):
        r = c.write(LIMIT + i * 4096, b'x' * 4096)
        if r.error != nbd.ENOSPC:
            fail('NBD write %d past the limit: error %d, not ENOSPC' % (i, r.error))
    if c.write(0, b'y' * 4096).error:
        fail('NBD write below the limit failed')
    c.request(nbd.CMD_DISC)
    c.expect_close('after NBD_CMD_DISC')


def vhost_writes(path):
    memfd, mem = guest_memory()
    fe = FrontEnd(path)
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0)
    buf, data = 0x10000, 0x20000
    for i in range(ERRORS):
        # header (OUT, sector), 4 KiB of data, status
        struct.pack_into('<IIQ', mem, buf, 1, 0, (LIMIT + i * 4096) // 512)
        mem[buf + 0x100] = 0xff
        q.next_desc = 0  # the last chain is used: its descriptors are free, none wraps
        q.offer([(buf, 16, F_NEXT, 1), (data, 4096, F_NEXT, 2), (buf + 0x100, 1, F_WRITE, 0)])
        q.wait_used(i + 1, 'write %d' % i)
        if mem[buf + 0x100] != 1:
            fail('vhost write %d past the limit: status %d, not IOERR' % (i, mem[buf + 0x100]))
    fe.close()
    return q


def main():
    tmp = tempfile.mkdtemp(prefix='ioplane-ioerr.')
    ok = False
    d = None
    try:
        img = os.path.join(tmp, 'disk.raw')
        with open(img, 'wb') as f:
            f.truncate(4 * LIMIT)
        nsock, vsock = os.path.join(tmp, 'nbd.sock'), os.path.join(tmp, 'vhost.sock')
        d = Daemon(tmp, ['--image', 'n,file=%s' % img, '--image', 'v,file=%s' % img,
                         '--nbd', 'unix=%s,image=n,writable=on' % nsock,
                         '--vhost-user-blk', 'unix=%s,image=v,writable=on' % vsock],
                   preexec=limited)
        d.wait_socket(nsock)
        d.wait_socket(vsock)
        nbd_writes(nsock)
        vhost_writes(vsock)
        d.stop()
        log = d.log_text()
        nbd_lines = [ln for ln in log.splitlines() if "nbd: export 'n': write" in ln]
        vhost_lines = [ln for ln in log.splitlines()
                       if 'vhost.sock: queue 0: write at offset' in ln]
        for what, lines in (('NBD', nbd_lines), ('vhost-user-blk', vhost_lines)):
            if len(lines) != 10 or not all('failed: File too large' in ln for ln in lines):
                fail('%s: %d error lines, not 10: %r' % (what, len(lines), lines))
        if "nbd: export 'n': %d I/O errors in all, the first 10 logged" % ERRORS not in log:
            fail('no NBD total')
        if 'vhost.sock: queue 0: %d I/O errors in all, the first 10 logged' % ERRORS not in log:
            fail('no vhost-user-blk total')
        ok = True
        print('PASS: 10 errors logged and the total, for NBD and for vhost-user-blk')
    finally:
        if d:
            d.cleanup(ok)
        shutil.rmtree(tmp, ignore_errors=True)


main()
