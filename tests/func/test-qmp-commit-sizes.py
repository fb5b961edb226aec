#!/usr/bin/env python3
"""block-commit into a base of another size, the same script against ioplane and
qemu-storage-daemon:

1. Intermediate commit into a base smaller than the top: the base grows to the top's
   size, the data past the base's old end arrives, and the chain reads as before.
2. Active commit into a smaller base: the same, through the mirror that completes by
   switching the export to the base; the export then serves the grown base.
3. Active commit into a larger base: allowed; the base keeps its size and the part past
   the top's end keeps the base's old data.

Each case checks sizes (qemu-img info), qemu-img check and content (qemu-img compare
against an expected raw image), and the replies and event names match between the two
daemons. Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Closed, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if r.returncode:
        fail('%s: rc %d %s%s' % (' '.join(argv), r.returncode, r.stdout[-2000:],
                                 r.stderr[-2000:]))
    return r.stdout


def qemu_io(path, cmds, fmt='qcow2'):
    argv = ['qemu-io', '-f', fmt]
    for c in cmds:
        argv += ['-c', c]
    out = run(argv + [path])
    if 'fail' in out.lower() or 'error' in out.lower():
        fail('qemu-io %s %r: %s' % (path, cmds, out[-2000:]))


def vsize(path):
    return json.loads(run(['qemu-img', 'info', '--output=json', path]))['virtual-size']


def create(path, size, backing=None):
    argv = ['qemu-img', 'create', '-q', '-f', 'qcow2']
    if backing:
        argv += ['-b', backing, '-F', 'qcow2']
    run(argv + [path, str(size)])


def make(tmp, kind, case):
    """The chain of a case and the raw image its top reads as."""
    p = {n: os.path.join(tmp, '%s-%s-%s.qcow2' % (kind, case, n)) for n in ('base', 'mid', 'top')}
    base_size = 48 * MiB if case == 'larger' else 16 * MiB
    create(p['base'], base_size)
    qemu_io(p['base'], ['write -P 0x11 0 8M', 'write -P 0x12 15M 1M'] +
            (['write -P 0x13 40M 4M'] if case == 'larger' else []))
    top_backing = p['base']
    if case == 'intermediate':
        create(p['mid'], 32 * MiB, p['base'])
        qemu_io(p['mid'], ['write -P 0x21 4M 2M', 'write -P 0x22 20M 6M'])
        top_backing = p['mid']
    create(p['top'], 32 * MiB, top_backing)
    qemu_io(p['top'], ['write -P 0x31 1M 1M', 'write -P 0x32 28M 1M'])
    expect = os.path.join(tmp, '%s-%s-expect.raw' % (kind, case))
    run(['qemu-img', 'convert', '-O', 'raw', p['top'], expect])
    return p, expect


def args_for(p, case):
    a = ['--blockdev', 'driver=file,filename=%s,node-name=basef' % p['base'],
         '--blockdev', 'driver=qcow2,file=basef,node-name=base,read-only=on']
    below = 'base'
    if case == 'intermediate':
        a += ['--blockdev', 'driver=file,filename=%s,node-name=midf' % p['mid'],
              '--blockdev', 'driver=qcow2,file=midf,backing=base,node-name=mid,read-only=on']
        below = 'mid'
    a += ['--blockdev', 'driver=file,filename=%s,node-name=topf' % p['top'],
          '--blockdev', 'driver=qcow2,file=topf,backing=%s,node-name=top' % below]
    return a


def one(kind, tmp, case):
    p, expect = make(tmp, kind, case)
    sock = os.path.join(tmp, '%s-%s.sock' % (kind, case))
    d = Daemon(kind, tmp, args_for(p, case) + [
        '--nbd-server', 'addr.type=unix,addr.path=' + sock,
        '--export', 'type=nbd,id=e,node-name=top,name=top,writable=on'])
    uri = 'nbd+unix:///top?socket=' + sock
    log, ok = [], False
    try:
        c = d.client().negotiate()
        args = {'job-id': 'j', 'device': 'top'}
        if case == 'intermediate':
            args['top-node'] = 'mid'
        log.append(c.cmd('block-commit', args))
        if case != 'intermediate':
            e = c.wait_event('BLOCK_JOB_READY', timeout=60)
            if not e:
                fail('%s %s: no BLOCK_JOB_READY: %r' % (kind, case, c.cmd('query-jobs')))
            log.append(e['event'])
            log.append(c.cmd('job-complete', {'id': 'j'}))
        e = c.wait_event('BLOCK_JOB_COMPLETED', timeout=60)
        if not e or 'error' in e['data']:
            fail('%s %s: %r' % (kind, case, e))
        log.append((e['event'], e['data']['len'], e['data']['offset']))
        if case != 'intermediate':
            # The export now serves the base: its last MiB is the top's.
            qemu_io(uri, ['read -P 0x32 28M 1M'], fmt='raw')
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    want = 48 * MiB if case == 'larger' else 32 * MiB
    if vsize(p['base']) != want:
        fail('%s %s: base is %d bytes, not %d' % (kind, case, vsize(p['base']), want))
    run(['qemu-img', 'check', '-q', p['base']])
    if case == 'intermediate':
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', p['top'], expect])
    elif case == 'smaller':
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', p['base'], expect])
    else:
        # The top's 32 MiB, then the base's own tail (0x13 at 40M) untouched.
        qemu_io(p['base'], ['read -P 0x31 1M 1M', 'read -P 0x32 28M 1M',
                            'read -P 0x13 40M 4M', 'read -P 0 32M 8M'])
        with open(expect, 'r+b') as f:
            f.truncate(32 * MiB)
            f.seek(40 * MiB)
            f.write(b'\x13' * (4 * MiB))
            f.truncate(48 * MiB)
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'raw', p['base'], expect])
    return log


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    cases = ('intermediate', 'smaller', 'larger')
    with tempfile.TemporaryDirectory() as tmp:
        mine = {c: one('ioplane', tmp, c) for c in cases}
        if not QSD:
            skip('qemu-storage-daemon is not installed: ioplane grew the bases, the '
                 'comparison did not run')
        theirs = {c: one('qsd', tmp, c) for c in cases}
    for c in cases:
        if mine[c] != theirs[c]:
            fail('%s: ioplane %r, qsd %r' % (c, mine[c], theirs[c]))
    print('PASS: commit grows a smaller base and keeps a larger one, as qsd does')


if __name__ == '__main__':
    try:
        main()
    except (Closed, TimeoutError, ConnectionError) as e:
        fail('%s: %s' % (type(e).__name__, e))
