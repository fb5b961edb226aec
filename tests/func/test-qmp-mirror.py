#!/usr/bin/env python3
"""blockdev-mirror and active block-commit under writes, the same script against ioplane and
qemu-storage-daemon:

1. Mirror (background and write-blocking): qemu-io writes patterns through the NBD export of
   the source while the job copies; it reaches READY (BLOCK_JOB_READY), job-complete switches
   the export to the target (a later write lands in the target only), and the target equals
   the source plus those writes (qemu-img compare), both images checked.
2. A writable export of the target, and a second job on the source, are refused while the
   mirror runs.
3. block-job-cancel after READY (no force): BLOCK_JOB_COMPLETED, the export stays on the
   source and the target equals the source at that point. A forced cancel mid-copy
   (rate-limited): BLOCK_JOB_CANCELLED, the source intact, the target valid.
4. Active commit: block-commit of the active layer is a job of type "commit" that reaches
   READY and on job-complete switches the export down to base, which then holds the whole
   chain's data plus the writes.
5. ioplane only: kill -9 mid-mirror and mid-commit leaves images qemu-img check accepts, the
   source (the chain the top names) with every acknowledged write.

Exit 0 pass, 77 skip, 1 fail."""
import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, skip  # noqa: E402
from _copyjobs import (  # noqa: E402
    MiB, SIZE, end_writer, qemu_io, run, start_writer, wait, writes)


def daemon(kind, tmp, img, extra=(), tag=None):
    tmp = os.path.join(tmp, tag or kind)
    os.makedirs(tmp, exist_ok=True)
    sock = os.path.join(tmp, kind + '.nbd')
    args = ['--nbd-server', 'addr.type=unix,addr.path=' + sock]
    for name, path in img.items():
        args += ['--blockdev', 'driver=file,filename=%s,node-name=%s-f' % (path, name)]
    args += list(extra)
    return Daemon(kind, tmp, args), sock


def new_images(tmp, tag):
    src, tgt = os.path.join(tmp, tag + '-src.qcow2'), os.path.join(tmp, tag + '-tgt.qcow2')
    ref = os.path.join(tmp, tag + '-ref.qcow2')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', src, str(SIZE)])
    qemu_io(src, ['write -P 0x11 0 8M', 'write -P 0x12 12M 4M', 'write -z 20M 1M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', tgt, str(SIZE)])
    shutil.copyfile(src, ref)
    return src, tgt, ref


def qcow2_nodes(names):
    return [a for n in names for a in
            ('--blockdev', 'driver=qcow2,file=%s-f,node-name=%s' % (n, n))]


def checked(*paths):
    for p in paths:
        run(['qemu-img', 'check', '-q', p])


SECOND = {}  # kind: the error a second job on the source got


def mirror_case(kind, tmp, mode):
    tag = '%s-%s' % (kind, mode)
    src, tgt, ref = new_images(tmp, tag)
    d, sock = daemon(kind, tmp, {'src': src, 'tgt': tgt}, qcow2_nodes(['src', 'tgt']) + [
        '--export', 'type=nbd,id=e0,node-name=src,name=e0,writable=on'], tag)
    ok = False
    try:
        c = d.client().negotiate()
        before, after = writes(3), writes(77, 20)
        w = start_writer(sock, before)
        r = c.cmd('blockdev-mirror', {'job-id': 'm0', 'device': 'src', 'target': 'tgt',
                                      'sync': 'full', 'copy-mode': mode, 'buf-size': 4 * MiB})
        if 'error' in r:
            fail('%s blockdev-mirror: %r' % (tag, r))
        r = c.cmd('block-export-add', {'type': 'nbd', 'id': 'e1', 'node-name': 'tgt',
                                       'writable': True})
        if 'error' not in r:
            fail('%s: the mirror target was exported writable: %r' % (tag, r))
        # A second job on the source is refused, as QEMU's op blockers refuse it.
        r = c.cmd('blockdev-mirror', {'job-id': 'm9', 'device': 'src', 'target': 'tgt',
                                      'sync': 'full'})
        if 'error' not in r:
            fail('%s: a second job on the source: %r' % (tag, r))
        SECOND[kind] = r['error']['desc']
        wait(c, 'BLOCK_JOB_READY', tag)
        end_writer(w)
        jobs = c.cmd('query-jobs')['return']
        if [j['type'] for j in jobs] != ['mirror'] or jobs[0]['status'] != 'ready':
            fail('%s query-jobs: %r' % (tag, jobs))
        r = c.cmd('job-complete', {'id': 'm0'})
        if r != {'return': {}}:
            fail('%s job-complete: %r' % (tag, r))
        e = wait(c, 'BLOCK_JOB_COMPLETED', tag)
        if 'error' in e['data']:
            fail('%s completed with an error: %r' % (tag, e))
        # The export now serves the target: these land there only.
        end_writer(start_writer(sock, after))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    checked(src, tgt)
    qemu_io(ref, before)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, src])
    qemu_io(ref, after)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, tgt])


def cancel_case(kind, tmp):
    tag = kind + '-cancel'
    src, tgt, ref = new_images(tmp, tag)
    d, sock = daemon(kind, tmp, {'src': src, 'tgt': tgt}, qcow2_nodes(['src', 'tgt']) + [
        '--export', 'type=nbd,id=e0,node-name=src,name=e0,writable=on'], tag)
    tgt2 = os.path.join(tmp, tag + '-tgt2.qcow2')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', tgt2, str(SIZE)])
    ok = False
    try:
        c = d.client().negotiate()
        before, after = writes(5), writes(91, 20)
        w = start_writer(sock, before)
        r = c.cmd('blockdev-mirror', {'job-id': 'm1', 'device': 'src', 'target': 'tgt',
                                      'sync': 'full'})
        if 'error' in r:
            fail('%s blockdev-mirror: %r' % (tag, r))
        wait(c, 'BLOCK_JOB_READY', tag)
        end_writer(w)
        # Soft cancel when READY: completes, target in step, nobody switched.
        c.cmd('block-job-cancel', {'device': 'm1'})
        wait(c, 'BLOCK_JOB_COMPLETED', tag)
        end_writer(start_writer(sock, after))
        # A forced cancel in the middle of a slow copy.
        r = c.cmd('blockdev-add', {'driver': 'file', 'filename': tgt2, 'node-name': 'tgt2-f'})
        r = c.cmd('blockdev-add', {'driver': 'qcow2', 'file': 'tgt2-f', 'node-name': 'tgt2'})
        if 'error' in r:
            fail('%s blockdev-add: %r' % (tag, r))
        r = c.cmd('blockdev-mirror', {'job-id': 'm2', 'device': 'src', 'target': 'tgt2',
                                      'sync': 'full', 'speed': 4 * MiB})
        if 'error' in r:
            fail('%s blockdev-mirror m2: %r' % (tag, r))
        c.cmd('job-cancel', {'id': 'm2'})
        wait(c, 'BLOCK_JOB_CANCELLED', tag)
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    checked(src, tgt, tgt2)
    qemu_io(ref, before)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, tgt])
    qemu_io(ref, after)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, src])


def commit_case(kind, tmp):
    tag = kind + '-commit'
    base, top = os.path.join(tmp, tag + '-base.qcow2'), os.path.join(tmp, tag + '-top.qcow2')
    ref = os.path.join(tmp, tag + '-ref.qcow2')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', base, str(SIZE)])
    qemu_io(base, ['write -P 0x21 0 16M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', top, str(SIZE)])
    qemu_io(top, ['write -P 0x31 4M 2M', 'write -P 0x32 24M 1M'])
    run(['qemu-img', 'convert', '-O', 'qcow2', top, ref])
    d, sock = daemon(kind, tmp, {'base': base, 'top': top}, [
        '--blockdev', 'driver=qcow2,file=base-f,node-name=base,read-only=on',
        '--blockdev', 'driver=qcow2,file=top-f,backing=base,node-name=top',
        '--export', 'type=nbd,id=e0,node-name=top,name=e0,writable=on'], tag)
    ok = False
    try:
        c = d.client().negotiate()
        before, after = writes(11), writes(55, 20)
        w = start_writer(sock, before)
        r = c.cmd('block-commit', {'job-id': 'c0', 'device': 'top'})
        if 'error' in r:
            fail('%s block-commit: %r' % (tag, r))
        wait(c, 'BLOCK_JOB_READY', tag)
        end_writer(w)
        jobs = c.cmd('query-jobs')['return']
        if [j['type'] for j in jobs] != ['commit']:
            fail('%s query-jobs: %r' % (tag, jobs))
        c.cmd('job-complete', {'id': 'c0'})
        e = wait(c, 'BLOCK_JOB_COMPLETED', tag)
        if 'error' in e['data']:
            fail('%s completed with an error: %r' % (tag, e))
        end_writer(start_writer(sock, after))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    checked(base, top)
    qemu_io(ref, before + after)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, base])


def kill_case(tmp):
    tag = 'ioplane-kill'
    src, tgt, ref = new_images(tmp, tag)
    d, sock = daemon('ioplane', tmp, {'src': src, 'tgt': tgt}, qcow2_nodes(['src', 'tgt']) + [
        '--export', 'type=nbd,id=e0,node-name=src,name=e0,writable=on'], tag)
    ok = False
    try:
        c = d.client().negotiate()
        before = writes(17, 60)
        r = c.cmd('blockdev-mirror', {'job-id': 'm3', 'device': 'src', 'target': 'tgt',
                                      'sync': 'full', 'speed': 8 * MiB})
        if 'error' in r:
            fail('%s blockdev-mirror: %r' % (tag, r))
        end_writer(start_writer(sock, before))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        ok = True
    finally:
        d.cleanup(ok)
    for p in (src, tgt):
        r = run(['qemu-img', 'check', p], ok=(0, 3))  # 3: leaks only
        if 'corrupt' in r.stdout.lower() and 'no errors' not in r.stdout.lower():
            fail('%s: %s' % (p, r.stdout))
    qemu_io(ref, before)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, src])
    kill_commit_case(tmp)


def kill_commit_case(tmp):
    """kill -9 in the middle of an active commit: base and top check clean, and the
    chain top's header names holds every acknowledged write."""
    tag = 'ioplane-kill-commit'
    base, top = os.path.join(tmp, tag + '-base.qcow2'), os.path.join(tmp, tag + '-top.qcow2')
    ref = os.path.join(tmp, tag + '-ref.qcow2')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', base, str(SIZE)])
    qemu_io(base, ['write -P 0x51 0 16M'])
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', top, str(SIZE)])
    qemu_io(top, ['write -P 0x52 0 12M'])
    run(['qemu-img', 'convert', '-O', 'qcow2', top, ref])
    d, sock = daemon('ioplane', tmp, {'base': base, 'top': top}, [
        '--blockdev', 'driver=qcow2,file=base-f,node-name=base,read-only=on',
        '--blockdev', 'driver=qcow2,file=top-f,backing=base,node-name=top',
        '--export', 'type=nbd,id=e0,node-name=top,name=e0,writable=on'], tag)
    ok = False
    w = writes(23, 60)
    try:
        c = d.client().negotiate()
        r = c.cmd('block-commit', {'job-id': 'c1', 'device': 'top', 'speed': 4 * MiB})
        if 'error' in r:
            fail('%s block-commit: %r' % (tag, r))
        end_writer(start_writer(sock, w))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        ok = True
    finally:
        d.cleanup(ok)
    for p in (base, top):
        run(['qemu-img', 'check', p], ok=(0, 3))  # 3: leaks only
    qemu_io(ref, w)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, top])


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    kinds = ['ioplane'] + (['qsd'] if QSD else [])
    with tempfile.TemporaryDirectory(prefix='ioplane-mirror.') as tmp:
        for kind in kinds:
            for mode in ('background', 'write-blocking'):
                mirror_case(kind, tmp, mode)
            cancel_case(kind, tmp)
            commit_case(kind, tmp)
        kill_case(tmp)
    if QSD and SECOND['ioplane'] != SECOND['qsd']:
        fail('a second job: ioplane said %r, qsd %r' % (SECOND['ioplane'], SECOND['qsd']))
    if not QSD:
        print('qemu-storage-daemon not installed: ioplane only')
    print('ok')


if __name__ == '__main__':
    main()
