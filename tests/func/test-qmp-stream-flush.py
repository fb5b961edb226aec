#!/usr/bin/env python3
"""block-stream of a chain larger than the copy's flush-behind step (64 MiB: the top's
image file is flushed every 64 MiB copied, so that the flush before the header change
finds little left). A 96 MiB chain (base full, the middle layer half, the top 1 MiB) is
streamed whole into the top with auto-finalize off:

1. at BLOCK_JOB_PENDING (the copy done, prepare's flushes not yet run) the top's image
   file has had a flush and the qcow2 node none (the flush-behind goes to the file, not
   through qcow2, whose flush would hold every allocating write of the copy meanwhile);
2. once finalized, the top reads as the chain did, has no backing file and checks clean.

ioplane only (qsd has no flush-behind). Exit 0 pass, 77 skip, 1 fail."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _copyjobs import MiB, qemu_io, run  # noqa: E402
from _qmp import Closed, Daemon, fail, skip  # noqa: E402

SIZE = 96 * MiB


def make_chain(tmp, tag):
    """base (0x11 everywhere), mid (0x22 over the first half), top (0x33 at 1 MiB)."""
    base, mid, top = (os.path.join(tmp, '%s-%s.qcow2' % (tag, n))
                      for n in ('base', 'mid', 'top'))
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', base, str(SIZE)])
    qemu_io(base, ['write -P 0x11 0 %d' % SIZE])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', mid])
    qemu_io(mid, ['write -P 0x22 0 %d' % (SIZE // 2)])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', mid, '-F', 'qcow2', top])
    qemu_io(top, ['write -P 0x33 %d %d' % (MiB, MiB)])
    ref = os.path.join(tmp, tag + '-ref.raw')
    run(['qemu-img', 'convert', '-f', 'qcow2', '-O', 'raw', top, ref])
    return mid, top, ref


def flushes(c):
    """flush_operations of each node, by node name."""
    r = c.cmd('query-blockstats', {'query-nodes': True})
    return {n['node-name']: n['stats']['flush_operations'] for n in r['return']}


def main_case(tmp):
    _, top, ref = make_chain(tmp, 'whole')
    d = Daemon('ioplane', tmp, ['--blockdev', 'driver=file,filename=%s,node-name=topf' % top,
                                '--blockdev', 'driver=qcow2,file=topf,node-name=top'])
    ok = False
    try:
        c = d.client().negotiate()
        before = flushes(c)
        r = c.cmd('block-stream', {'job-id': 'j', 'device': 'top', 'auto-finalize': False})
        if 'error' in r:
            fail('block-stream: %r' % r)
        if not c.wait_event('BLOCK_JOB_PENDING', timeout=120):
            fail('no BLOCK_JOB_PENDING: %r' % c.cmd('query-jobs'))
        now = flushes(c)
        if now['topf'] <= before['topf'] or now['top'] != before['top']:
            fail('flushes before prepare: %r, at the start %r' % (now, before))
        c.cmd('job-finalize', {'id': 'j'})
        e = c.wait_event('BLOCK_JOB_COMPLETED', timeout=60)
        if not e or 'error' in e['data'] or e['data']['offset'] != SIZE:
            fail('stream: %r' % e)
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    info = run(['qemu-img', 'info', top]).stdout
    if 'backing' in info:
        fail('the top still has a backing file: %s' % info)
    run(['qemu-img', 'check', '-q', top])
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', top, ref])


def main():
    for tool in ('qemu-img', 'qemu-io'):
        if not shutil.which(tool):
            skip('%s is not installed' % tool)
    with tempfile.TemporaryDirectory() as tmp:
        main_case(tmp)
    print('PASS: a stream past its flush-behind step flushes the top\'s file while it '
          'copies, and leaves the chain\'s data in the top')


if __name__ == '__main__':
    try:
        main()
    except (Closed, TimeoutError, ConnectionError) as e:
        fail('%s: %s' % (type(e).__name__, e))
