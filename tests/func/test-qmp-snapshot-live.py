#!/usr/bin/env python3
"""Live external snapshots under write load, clients connected throughout:

1. NBD: fio (nbd engine, 4 KiB random writes at depth 16, crc32c verify with a
   backlog, rate-limited so that it is still writing) runs while a transaction whose
   second action fails is undone (the export stays on its node), then while
   blockdev-snapshot-sync switches the export to an overlay; fio's verify of every
   block passes (its reads go through the new chain).
2. vhost-user-blk: `ioplane bench --vhost-user -w --verify` writes the whole disk, pass
   after pass, while a snapshot is taken; a last bench run reads and verifies every
   block.
Afterwards both chains pass `qemu-img check`, both layers hold some of the writes (the
snapshot happened mid-stream), and the vhost-user-blk chain, converted to raw, holds
exactly what bench wrote.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import fail, skip  # noqa: E402
from _snaplive import (bad_block, bench_done, bench_writer, daemon, fio, fio_done,  # noqa: E402
                       run, writes)


def snapshot_when_writing(c, node, proc, overlay, name):
    """Once the node has taken writes and the writer still runs, snapshot it."""
    for _ in range(3000):
        if writes(c, node) > 64:
            break
        if proc.poll() is not None:
            fail('the writer ended before writing: %s' % proc.communicate())
        time.sleep(0.01)
    if proc.poll() is not None:
        fail('the writer ended before the snapshot could be taken')
    r = c.cmd('blockdev-snapshot-sync', {'node-name': node, 'snapshot-file': overlay,
                                         'snapshot-node-name': name, 'format': 'qcow2'})
    if r != {'return': {}}:
        fail('blockdev-snapshot-sync %s: %r' % (node, r))
    if proc.poll() is not None:
        fail('the writer ended while the snapshot was taken: no load to show')


def allocated(img):
    m = json.loads(run(['qemu-img', 'map', '--output=json', img]))
    return sum(e['length'] for e in m if e['depth'] == 0 and e['data'])


def check_chain(base, top):
    run(['qemu-img', 'check', '-q', base])
    run(['qemu-img', 'check', '-q', top])
    if not allocated(base) or not allocated(top):
        fail('%s / %s: writes in only one layer (%d, %d bytes)'
             % (base, top, allocated(base), allocated(top)))


def nbd_part(c, tmp, sock):
    f = fio(tmp, sock, 'snap')
    # Under load, a transaction whose second action fails: the first, switched
    # already, is undone; the export stays on n and fio notices nothing.
    for _ in range(3000):
        if writes(c, 'n') > 64 or f.poll() is not None:
            break
        time.sleep(0.01)
    r = c.cmd('transaction', {'actions': [
        {'type': 'blockdev-snapshot-sync', 'data': {
            'node-name': 'n', 'snapshot-file': os.path.join(tmp, 'n-x.qcow2'),
            'snapshot-node-name': 'n-x'}},
        {'type': 'blockdev-snapshot-sync', 'data': {
            'node-name': 'v', 'snapshot-file': os.path.join(tmp, 'no', 'such', 'dir.qcow2'),
            'snapshot-node-name': 'v-x'}}]})
    if 'error' not in r:
        fail('a transaction with an impossible action: %r' % r)
    exports = {e['id']: e['node-name'] for e in c.cmd('query-block-exports')['return']}
    if exports != {'en': 'n', 'ev': 'v'}:
        fail('after the failed transaction the exports serve %r' % exports)
    snapshot_when_writing(c, 'n', f, os.path.join(tmp, 'n-o1.qcow2'), 'n-o1')
    fio_done(f)


def vhost_part(c, tmp, vsock):
    w = bench_writer(vsock)
    snapshot_when_writing(c, 'v', w, os.path.join(tmp, 'v-o1.qcow2'), 'v-o1')
    bench_done(w, vsock)


def main():
    for t in ('qemu-img', 'fio'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    r = subprocess.run(['fio', '--enghelp'], capture_output=True, text=True)
    if 'nbd' not in r.stdout.split():
        skip('this fio has no nbd engine')
    with tempfile.TemporaryDirectory(prefix='ioplane-snaplive.') as tmp:
        d, sock, vsock = daemon(tmp)
        n, v = os.path.join(tmp, 'n.qcow2'), os.path.join(tmp, 'v.qcow2')
        ok = False
        try:
            c = d.client().negotiate()
            nbd_part(c, tmp, sock)
            vhost_part(c, tmp, vsock)
            c.cmd('quit')
            d.wait()
            ok = True
        finally:
            d.cleanup(ok)
        check_chain(n, os.path.join(tmp, 'n-o1.qcow2'))
        check_chain(v, os.path.join(tmp, 'v-o1.qcow2'))
        raw = os.path.join(tmp, 'v.raw')
        run(['qemu-img', 'convert', '-O', 'raw', os.path.join(tmp, 'v-o1.qcow2'), raw])
        if bad_block(raw) is not None:
            fail('the chain holds the wrong data at byte %d' % bad_block(raw))
    print('PASS: fio and bench verified across live snapshots; chains check clean')


main()
