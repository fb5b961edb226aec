#!/usr/bin/env python3
"""Internal qcow2 snapshots over QMP, the same script against qemu-storage-daemon and
`ioplane serve`, with a writable NBD export whose client stays connected:

1. blockdev-snapshot-internal-sync, blockdev-snapshot-delete-internal-sync and the
   transaction action: every reply is the same (errors: unknown node, a node that is
   not a root, raw, read-only, empty and duplicate names, delete without id and name,
   unknown snapshot; the SnapshotInfo of a delete with its times left out), and
   query-named-block-nodes lists the same snapshots.
2. What the snapshots hold: data written over NBD after a snapshot (writes, write
   zeroes, discards, into clusters the snapshot shares) never changes the snapshot's
   view (qemu-img convert -l snapshot.name=...), checked after the daemon exits; every
   step leaves an image `qemu-img check` finds clean; `qemu-img snapshot -a` restores
   a snapshot's exact content.
   All of it on standard, extended-L2 and version 2 images.
3. A snapshot while a client keeps writing: writes acknowledged before it are in it,
   and all acknowledged writes are in the active image.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, same_transcripts, skip  # noqa: E402

MiB = 1 << 20
TIMES = ('date-sec', 'date-nsec', 'vm-clock-sec', 'vm-clock-nsec')


def run(argv, ok=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if ok and r.returncode:
        fail('%s: %s%s' % (' '.join(argv), r.stdout, r.stderr))
    return r


def qemu_io(target, *cmds, fmt='raw', extra=()):
    argv = ['qemu-io', '-f', fmt] + list(extra)
    for c in cmds:
        argv += ['-c', c]
    r = run(argv + [target], ok=False)
    if r.returncode or 'Pattern verification failed' in r.stdout or 'failed' in r.stdout:
        fail('qemu-io %s %s: %s%s' % (target, cmds, r.stdout, r.stderr))


def untimed(v):
    """Replies with the clock fields dropped (they differ by run)."""
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if k not in TIMES}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def snaps(c):
    for n in c.cmd('query-named-block-nodes', {'flat': True})['return']:
        if n['node-name'] == 'q':
            return untimed(n['image'].get('snapshots'))
    return None


def snapshot_view(img, name, out):
    run(['qemu-img', 'convert', '-f', 'qcow2', '-O', 'raw', '-l', 'snapshot.name=' + name,
         img, out])
    with open(out, 'rb') as f:
        return f.read()


def expect(img, name, layout, tmp):
    """layout: (offset, length, byte) runs; the rest zero."""
    data = snapshot_view(img, name, os.path.join(tmp, name + '.raw'))
    want = bytearray(len(data))
    for off, ln, b in layout:
        want[off:off + ln] = bytes([b]) * ln
    if data != bytes(want):
        first = next(i for i in range(len(data)) if data[i] != want[i])
        fail('%s: snapshot %s differs at %d: %#x, not %#x' % (img, name, first, data[first],
                                                              want[first]))


def writer(uri, stop, done):
    """Keeps writing 64 KiB blocks (pattern = round) until stopped; records what was
    acknowledged."""
    n = 0
    while not stop.is_set() and n < 200:
        off = (8 + n % 8) * MiB
        qemu_io(uri, 'write -P %d %d 64k' % (0x40 + n % 64, off))
        done.append((off, 0x40 + n % 64))
        n += 1


def script(kind, tmp, opts):
    d = os.path.join(tmp, kind + opts.replace(',', '-').replace('=', '-'))
    os.mkdir(d)
    img, sock = os.path.join(d, 'img.qcow2'), os.path.join(d, 'nbd.sock')
    raw, ro = os.path.join(d, 'r.raw'), os.path.join(d, 'ro.qcow2')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o', opts, img, '32M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', ro, '1M'])
    run(['qemu-img', 'create', '-q', '-f', 'raw', raw, '1M'])
    qemu_io(img, 'write -P 0x11 0 4M', fmt='qcow2')
    uri = 'nbd+unix:///q?socket=' + sock
    dm = Daemon(kind, d, [
        '--blockdev', 'driver=file,filename=%s,node-name=f' % img,
        '--blockdev', 'driver=qcow2,file=f,node-name=q',
        '--blockdev', 'driver=file,filename=%s,node-name=rf' % raw,
        '--blockdev', 'driver=raw,file=rf,node-name=r',
        '--blockdev', 'driver=file,filename=%s,node-name=rof,read-only=on' % ro,
        '--blockdev', 'driver=qcow2,file=rof,node-name=ro,read-only=on',
        '--nbd-server', 'addr.type=unix,addr.path=' + sock,
        '--export', 'type=nbd,id=e,node-name=q,writable=on'])
    out = []
    ok = False
    try:
        c = dm.client().negotiate()

        def cmd(name, args=None):
            r = untimed(c.cmd(name, args))
            out.append((name, json.loads(json.dumps(args).replace(d, '$D')), r))
            return r

        def mk(name):
            r = cmd('blockdev-snapshot-internal-sync', {'device': 'q', 'name': name})
            if r != {'return': {}}:
                fail('%s: snapshot %s: %s' % (kind, name, r))

        for dev, name in (('zz', 'x'), ('f', 'x'), ('r', 'x'), ('ro', 'x'), ('q', '')):
            cmd('blockdev-snapshot-internal-sync', {'device': dev, 'name': name})
        mk('s1')  # 0x11 in [0, 4M)
        cmd('blockdev-snapshot-internal-sync', {'device': 'q', 'name': 's1'})
        # Over the shared clusters: data, zeroes, discard, and a write into a new L2
        # table's range.
        qemu_io(uri, 'write -P 0x22 0 1M', 'write -z 1M 512k', 'discard 2M 1M',
                'write -P 0x23 3M 4k', 'write -P 0x24 20M 64k')
        act = {'type': 'blockdev-snapshot-internal-sync',
               'data': {'device': 'q', 'name': 't1'}}
        cmd('transaction', {'actions': [act, {'type': 'blockdev-snapshot-internal-sync',
                                              'data': {'device': 'q', 'name': 's1'}}]})
        out.append(('after a failed transaction', snaps(c)))
        if cmd('transaction', {'actions': [act]}) != {'return': {}}:
            fail('%s: transaction failed' % kind)
        qemu_io(uri, 'write -P 0x33 512k 1M', 'write -z 3M 1M')
        # Live: a client writes while the snapshot is made.
        stop, done = threading.Event(), []
        w = threading.Thread(target=writer, args=(uri, stop, done))
        w.start()
        while len(done) < 3 and w.is_alive():
            w.join(0.01)
        before = list(done)
        mk('live')
        while len(done) < len(before) + 3 and w.is_alive():
            w.join(0.01)
        stop.set()
        w.join(60)
        out.append(('snapshots', snaps(c)))
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'q'})
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'q', 'name': 'nope'})
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'q', 'id': '9', 'name': 't1'})
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'zz', 'name': 't1'})
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'q', 'id': '2', 'name': 't1'})
        mk('s3')
        cmd('blockdev-snapshot-delete-internal-sync', {'device': 'q', 'name': 's3'})
        out.append(('snapshots after delete', snaps(c)))
        # With an external snapshot in one transaction: the node, drained by the
        # first action, still flushes for the second.
        top = os.path.join(d, 'top.qcow2')
        cmd('transaction', {'actions': [
            {'type': 'blockdev-snapshot-internal-sync', 'data': {'device': 'q', 'name': 'x1'}},
            {'type': 'blockdev-snapshot-sync', 'data': {
                'node-name': 'q', 'snapshot-file': top, 'snapshot-node-name': 't'}}]})
        out.append(('snapshots of the old top', snaps(c)))
        c.cmd('quit')
        dm.wait()
        ok = True
    finally:
        dm.cleanup(ok)
    r = run(['qemu-img', 'check', img], ok=False)
    if r.returncode:
        fail('%s: qemu-img check: %s%s' % (kind, r.stdout, r.stderr))
    expect(img, 's1', [(0, 4 * MiB, 0x11)], d)
    live = {}
    for off, b in done:
        live[off] = b
    lv = snapshot_view(img, 'live', os.path.join(d, 'live.raw'))
    for i, (off, b) in enumerate(before):
        # The last write there before the snapshot, or one made after it.
        ok_vals = {b} | {x for o, x in done[i + 1:] if o == off}
        if off not in [o for o, _ in before[i + 1:]] and lv[off] not in ok_vals:
            fail('%s: snapshot live holds %#x at %d, not a write acknowledged before it'
                 % (kind, lv[off], off))
    for off, b in live.items():
        qemu_io(img, 'read -P %d %d 64k' % (b, off), fmt='qcow2')
    run(['qemu-img', 'snapshot', '-a', 's1', img])
    run(['qemu-img', 'check', img])
    qemu_io(img, 'read -P 0x11 0 4M', 'read -P 0 4M 28M', fmt='qcow2')
    return out, r.stdout.count('No errors')


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    mine, theirs = [], []
    with tempfile.TemporaryDirectory(prefix='ioplane-isnap.') as tmp:
        for opts in ('compat=1.1', 'extended_l2=on,cluster_size=16k', 'compat=0.10'):
            mine += script('ioplane', tmp, opts)[0]
            theirs += script('qsd', tmp, opts)[0]
    same_transcripts(mine, theirs)


main()
