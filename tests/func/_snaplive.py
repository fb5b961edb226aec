"""Shared by the live snapshot tests (test-qmp-snapshot-live.py,
test-qmp-snapshot-internal-live.py): a daemon exporting two qcow2 images, n over NBD
and v over vhost-user-blk, and the writers that keep them busy (fio with verify over
NBD, `ioplane bench --vhost-user -w --verify` pass after pass)."""
import os
import shutil
import struct
import subprocess
import time

from _qmp import IOPLANE, Daemon, fail, skip

MiB = 1 << 20
BLOCKS = 4096  # vhost-user-blk: 16 MiB of 4 KiB blocks
PASSES = 8  # bench -w runs one after another: snapshots land before the last
PATTERN = 7


def need_tools():
    """Skip unless qemu-img and a fio with the nbd engine are here."""
    for t in ('qemu-img', 'fio'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    r = subprocess.run(['fio', '--enghelp'], capture_output=True, text=True)
    if 'nbd' not in r.stdout.split():
        skip('this fio has no nbd engine')


def serve(tmp, parts):
    """The daemon of daemon(tmp), with each part(c, tmp, sock, vsock) run in turn while
    it serves; then quit."""
    d, sock, vsock = daemon(tmp)
    good = False
    try:
        c = d.client().negotiate()
        for part in parts:
            part(c, tmp, sock, vsock)
        c.cmd('quit')
        d.wait()
        good = True
    finally:
        d.cleanup(good)


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


def daemon(tmp):
    """Images n.qcow2 (16 MiB) and v.qcow2 made and served; returns (daemon, nbd socket,
    vhost-user socket)."""
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
    return d, sock, vsock


def fio(tmp, sock, name):
    """fio writing n at 1500 IOPS with verify (rate-limited: still writing when the
    snapshots come)."""
    return subprocess.Popen(
        ['timeout', '300', 'fio', '--name=' + name, '--ioengine=nbd',
         '--uri=nbd+unix:///n?socket=' + sock, '--rw=randwrite', '--bs=4k', '--size=16M',
         '--iodepth=16', '--rate_iops=1500', '--verify=crc32c', '--verify_fatal=1',
         '--do_verify=1', '--verify_backlog=128', '--randrepeat=1', '--output-format=json'],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)


def fio_done(p):
    """fio's end: it must have written and verified all 16 MiB."""
    out, err = p.communicate(timeout=300)
    if p.returncode:
        fail('fio across the snapshot: %s %s' % (out[-2000:], err[-2000:]))
    j = __import__('json').loads(out[out.index('{'):])['jobs'][0]
    if j['error'] or j['write']['io_kbytes'] < 16384 or j['read']['io_kbytes'] < 16384:
        fail('fio: %r' % {k: j[k] for k in ('error', 'write', 'read') if k in j})


def bench_cmd(vsock):
    return [IOPLANE, 'bench', '--vhost-user', vsock, '-d', '16', '-c', str(BLOCKS - 1),
            '--verify', '--pattern=%d' % PATTERN, '-q']


def bench_writer(vsock):
    """bench -w, PASSES times over the whole disk."""
    loop = 'for i in $(seq %d); do "$@" || exit 1; done' % PASSES
    return subprocess.Popen(['timeout', '300', 'bash', '-c', loop, 'bench'] +
                            bench_cmd(vsock) + ['-w'], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def bench_done(w, vsock):
    out, err = w.communicate(timeout=300)
    if w.returncode:
        fail('bench -w across the snapshot: %s %s' % (out, err))
    run(bench_cmd(vsock), timeout=300)  # reads and verifies every block


def bad_block(path):
    """The first byte of a raw image where bench's data is not, or None."""
    p = PATTERN * 0x0101010101010101
    with open(path, 'rb') as f:
        data = f.read((BLOCKS - 1) * 4096)
    for off in range(0, len(data), 8):
        if struct.unpack_from('<Q', data, off)[0] != off ^ p:
            return off
    return None


def wait_writes(c, node, proc, more):
    """Until the node has taken `more` writes more, the writer still running."""
    start = writes(c, node)
    for _ in range(3000):
        if writes(c, node) >= start + more:
            return
        if proc.poll() is not None:
            fail('the writer ended before writing: %s' % (proc.communicate(),))
        time.sleep(0.01)
