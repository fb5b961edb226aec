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
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import IOPLANE, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20
BLOCKS = 4096  # vhost-user-blk: 16 MiB of 4 KiB blocks
PASSES = 8  # bench -w runs one after another: the snapshot lands before the last
PATTERN = 7


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop('timeout', 120),
                       stdin=subprocess.DEVNULL, **kw)
    if r.returncode:
        fail('%s: %s%s' % (' '.join(argv), r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout


def writes(c, node):
    for s in c.cmd('query-blockstats', {'query-nodes': True})['return']:
        if s.get('node-name') == node:
            return s['stats']['wr_operations']
    return 0


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
    uri = 'nbd+unix:///n?socket=' + sock
    fio = subprocess.Popen(
        ['timeout', '300', 'fio', '--name=snap', '--ioengine=nbd', '--uri=' + uri,
         '--rw=randwrite', '--bs=4k', '--size=16M', '--iodepth=16', '--rate_iops=1500',
         '--verify=crc32c', '--verify_fatal=1', '--do_verify=1', '--verify_backlog=128',
         '--randrepeat=1', '--output-format=json'],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    # Under load, a transaction whose second action fails: the first, switched
    # already, is undone; the export stays on n and fio notices nothing.
    for _ in range(3000):
        if writes(c, 'n') > 64 or fio.poll() is not None:
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
    snapshot_when_writing(c, 'n', fio, os.path.join(tmp, 'n-o1.qcow2'), 'n-o1')
    out, err = fio.communicate(timeout=300)
    if fio.returncode:
        fail('fio across the snapshot: %s %s' % (out[-2000:], err[-2000:]))
    j = json.loads(out[out.index('{'):])['jobs'][0]
    if j['error'] or j['write']['io_kbytes'] < 16384 or j['read']['io_kbytes'] < 16384:
        fail('fio: %r' % {k: j[k] for k in ('error', 'write', 'read') if k in j})


def vhost_part(c, tmp, vsock):
    bench = [IOPLANE, 'bench', '--vhost-user', vsock, '-d', '16', '-c', str(BLOCKS - 1),
             '--verify', '--pattern=%d' % PATTERN, '-q']
    loop = 'for i in $(seq %d); do "$@" || exit 1; done' % PASSES
    w = subprocess.Popen(['timeout', '300', 'bash', '-c', loop, 'bench'] + bench + ['-w'],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    snapshot_when_writing(c, 'v', w, os.path.join(tmp, 'v-o1.qcow2'), 'v-o1')
    out, err = w.communicate(timeout=300)
    if w.returncode:
        fail('bench -w across the snapshot: %s %s' % (out, err))
    run(bench, timeout=300)  # reads and verifies every block through the chain


def check_raw(path):
    p = PATTERN * 0x0101010101010101
    with open(path, 'rb') as f:
        data = f.read((BLOCKS - 1) * 4096)
    for off in range(0, len(data), 8):
        if struct.unpack_from('<Q', data, off)[0] != off ^ p:
            fail('the chain holds the wrong data at byte %d' % off)


def main():
    for t in ('qemu-img', 'fio'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    r = subprocess.run(['fio', '--enghelp'], capture_output=True, text=True)
    if 'nbd' not in r.stdout.split():
        skip('this fio has no nbd engine')
    with tempfile.TemporaryDirectory(prefix='ioplane-snaplive.') as tmp:
        n, v = os.path.join(tmp, 'n.qcow2'), os.path.join(tmp, 'v.qcow2')
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', n, '16M'])
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', v, '%dM' % (BLOCKS * 4096 // MiB)])
        sock, vsock = os.path.join(tmp, 'nbd.sock'), os.path.join(tmp, 'vu.sock')
        d = Daemon('ioplane', tmp, [
            '--blockdev', 'driver=file,filename=%s,node-name=nf' % n,
            '--blockdev', 'driver=qcow2,file=nf,node-name=n',
            '--blockdev', 'driver=file,filename=%s,node-name=vf' % v,
            '--blockdev', 'driver=qcow2,file=vf,node-name=v',
            '--object', 'iothread,id=io0', '--object', 'iothread,id=io1',
            '--nbd-server', 'addr.type=unix,addr.path=' + sock,
            '--export', 'type=nbd,id=en,node-name=n,writable=on,iothread=io0',
            '--export', 'type=vhost-user-blk,id=ev,node-name=v,writable=on,iothread=io1,'
            'addr.type=unix,addr.path=' + vsock])
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
        check_raw(raw)
    print('PASS: fio and bench verified across live snapshots; chains check clean')


main()
