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
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import fail  # noqa: E402
from _snaplive import (bad_block, bench_done, bench_writer, fio, fio_done, need_tools,  # noqa: E402
                       run, serve, writes)


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


def nbd_part(c, tmp, sock, vsock):
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


def vhost_part(c, tmp, sock, vsock):
    w = bench_writer(vsock)
    snapshot_when_writing(c, 'v', w, os.path.join(tmp, 'v-o1.qcow2'), 'v-o1')
    bench_done(w, vsock)


def main():
    need_tools()
    with tempfile.TemporaryDirectory(prefix='ioplane-snaplive.') as tmp:
        serve(tmp, [nbd_part, vhost_part])
        n, v = os.path.join(tmp, 'n.qcow2'), os.path.join(tmp, 'v.qcow2')
        check_chain(n, os.path.join(tmp, 'n-o1.qcow2'))
        check_chain(v, os.path.join(tmp, 'v-o1.qcow2'))
        raw = os.path.join(tmp, 'v.raw')
        run(['qemu-img', 'convert', '-O', 'raw', os.path.join(tmp, 'v-o1.qcow2'), raw])
        if bad_block(raw) is not None:
            fail('the chain holds the wrong data at byte %d' % bad_block(raw))
    print('PASS: fio and bench verified across live snapshots; chains check clean')


main()
