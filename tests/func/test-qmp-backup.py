#!/usr/bin/env python3
"""blockdev-backup through copy-before-write, the same script against ioplane and
qemu-storage-daemon:

1. sync=full (rate-limited) while qemu-io writes patterns through the NBD export of the
   source: the target equals the source as it was when the job started (qemu-img compare
   with a copy taken before), the source holds every write; with bitmap b0 and
   bitmap-mode=on-success, b0 afterwards holds the writes made during the job.
2. A writable export of the target is refused while the backup runs (ioplane; QEMU allows
   it).
3. Incremental: sync=bitmap with b0 into an overlay of the full backup, with writes going
   on: overlay + full backup equal the source at the start of the incremental job.
4. A forced cancel mid-backup leaves the source intact and the target valid.
5. ioplane only: kill -9 mid-backup leaves images qemu-img check accepts.
6. sync=top copies the source's own layer only.
7. A copy-before-write node made with blockdev-add (fleecing): reads through it are the
   source's, and the target gets the old data of what is overwritten.

Exit 0 pass, 77 skip, 1 fail."""
import os
import shutil
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, skip  # noqa: E402
from _copyjobs import (  # noqa: E402
    MiB, SIZE, end_writer, qemu_io, run, start_writer, uri, wait, writes)


def ok_cmd(c, name, args, what):
    r = c.cmd(name, args)
    if 'error' in r:
        fail('%s %s: %r' % (what, name, r))
    return r


def qcow2(path, backing=None):
    argv = ['qemu-img', 'create', '-q', '-f', 'qcow2']
    if backing:
        argv += ['-b', backing, '-F', 'qcow2']
    run(argv + [path, str(SIZE)])


def daemon(kind, tmp, tag, imgs):
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    sock = os.path.join(d, 'nbd.sock')
    args = ['--nbd-server', 'addr.type=unix,addr.path=' + sock]
    for name, path in imgs:
        args += ['--blockdev', 'driver=file,filename=%s,node-name=%s-f' % (path, name),
                 '--blockdev', 'driver=qcow2,file=%s-f,node-name=%s' % (name, name)]
    args += ['--export', 'type=nbd,id=e0,node-name=src,name=e0,writable=on']
    return Daemon(kind, d, args), sock


def bitmap_count(c, node, name):
    for dev in c.cmd('query-named-block-nodes')['return']:
        if dev['node-name'] == node:
            for b in dev.get('dirty-bitmaps', []):
                if b.get('name') == name:
                    return b['count']
    fail('no bitmap %s on %s' % (name, node))


def full_and_incremental(kind, tmp):
    tag = kind + '-full'
    src, tgt = os.path.join(tmp, tag + '-src.qcow2'), os.path.join(tmp, tag + '-tgt.qcow2')
    inc, ref, ref2 = (os.path.join(tmp, tag + x) for x in ('-inc.qcow2', '-ref.qcow2',
                                                            '-ref2.qcow2'))
    qcow2(src)
    qemu_io(src, ['write -P 0x11 0 10M', 'write -P 0x12 16M 8M'])
    qcow2(tgt)
    qcow2(inc, tgt)
    d, sock = daemon(kind, tmp, tag, [('src', src), ('tgt', tgt)])
    ok = False
    w1, w2 = writes(7, 100, 6), writes(41, 40, 6)
    try:
        c = d.client().negotiate()
        ok_cmd(c, 'block-dirty-bitmap-add', {'node': 'src', 'name': 'b0'}, tag)
        end_writer(start_writer(sock, ['write -P 0x99 30M 64k']))  # before: b0 forgets it
        run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2', uri(sock), ref])
        ok_cmd(c, 'blockdev-backup', {'job-id': 'b1', 'device': 'src', 'target': 'tgt',
                                      'sync': 'full', 'speed': 16 * MiB, 'bitmap': 'b0',
                                      'bitmap-mode': 'on-success'}, tag)
        w = start_writer(sock, w1)
        r = c.cmd('block-export-add', {'type': 'nbd', 'id': 'e1', 'node-name': 'tgt',
                                       'writable': True})
        # QEMU lets the backup target be exported writable (its copy-before-write
        # target child shares write); ioplane does not, so that nobody can spoil the
        # point-in-time copy.
        if kind == 'ioplane' and 'error' not in r:
            fail('%s: the backup target was exported writable: %r' % (tag, r))
        if 'error' not in r:
            ok_cmd(c, 'block-export-del', {'id': 'e1'}, tag)
        end_writer(w)
        e = wait(c, 'BLOCK_JOB_COMPLETED', tag)
        if 'error' in e['data']:
            fail('%s: %r' % (tag, e))
        if bitmap_count(c, 'src', 'b0') == 0:
            fail('%s: b0 did not record the writes during the backup' % tag)
        # The source as it is now is what the incremental job must give.
        run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2', uri(sock), ref2])
        ok_cmd(c, 'blockdev-add', {'driver': 'file', 'filename': inc, 'node-name': 'inc-f'},
               tag)
        ok_cmd(c, 'blockdev-add', {'driver': 'qcow2', 'file': 'inc-f', 'node-name': 'inc',
                                   'backing': 'tgt'}, tag)
        ok_cmd(c, 'blockdev-backup', {'job-id': 'b2', 'device': 'src', 'target': 'inc',
                                      'sync': 'bitmap', 'bitmap': 'b0',
                                      'bitmap-mode': 'on-success', 'speed': 16 * MiB}, tag)
        w = start_writer(sock, w2)
        end_writer(w)
        e = wait(c, 'BLOCK_JOB_COMPLETED', tag + '-inc')
        if 'error' in e['data']:
            fail('%s: %r' % (tag, e))
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    run(['qemu-img', 'check', '-q', src])
    run(['qemu-img', 'check', '-q', tgt])
    run(['qemu-img', 'check', '-q', inc])
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, tgt])
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref2, inc])
    qemu_io(ref2, w2)
    run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref2, src])


def cancel_and_kill(kind, tmp):
    for how in ('cancel', 'kill') if kind == 'ioplane' else ('cancel',):
        tag = '%s-%s' % (kind, how)
        src, tgt = os.path.join(tmp, tag + '-src.qcow2'), os.path.join(tmp, tag + '-tgt.qcow2')
        ref = os.path.join(tmp, tag + '-ref.qcow2')
        qcow2(src)
        qemu_io(src, ['write -P 0x21 0 20M'])
        qcow2(tgt)
        shutil.copyfile(src, ref)
        d, sock = daemon(kind, tmp, tag, [('src', src), ('tgt', tgt)])
        ok = False
        w = writes(13, 60, 6)
        try:
            c = d.client().negotiate()
            ok_cmd(c, 'blockdev-backup', {'job-id': 'b3', 'device': 'src', 'target': 'tgt',
                                          'sync': 'full', 'speed': 4 * MiB}, tag)
            end_writer(start_writer(sock, w))
            if how == 'cancel':
                c.cmd('job-cancel', {'id': 'b3'})
                wait(c, 'BLOCK_JOB_CANCELLED', tag)
                c.cmd('quit')
                d.wait()
            else:
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait()
            ok = True
        finally:
            d.cleanup(ok)
        for p in (src, tgt):
            r = run(['qemu-img', 'check', p], ok=(0, 3))  # 3: leaked clusters only
            if 'ERROR' in r.stdout:
                fail('%s: %s' % (p, r.stdout))
        qemu_io(ref, w)
        run(['qemu-img', 'compare', '-q', '-f', 'qcow2', '-F', 'qcow2', ref, src])


def top_case(kind, tmp):
    """sync=top copies what the source's own layer holds, not its backing file's."""
    tag = kind + '-top'
    base, src = os.path.join(tmp, tag + '-base.qcow2'), os.path.join(tmp, tag + '-src.qcow2')
    tgt = os.path.join(tmp, tag + '-tgt.qcow2')
    qcow2(base)
    qemu_io(base, ['write -P 0x41 0 8M'])
    qcow2(src, base)
    qemu_io(src, ['write -P 0x42 2M 1M', 'write -P 0x43 20M 64k'])
    qcow2(tgt)
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    dm = Daemon(kind, d, [
        '--blockdev', 'driver=file,filename=%s,node-name=base-f' % base,
        '--blockdev', 'driver=qcow2,file=base-f,node-name=base,read-only=on',
        '--blockdev', 'driver=file,filename=%s,node-name=src-f' % src,
        '--blockdev', 'driver=qcow2,file=src-f,backing=base,node-name=src',
        '--blockdev', 'driver=file,filename=%s,node-name=tgt-f' % tgt,
        '--blockdev', 'driver=qcow2,file=tgt-f,node-name=tgt'])
    ok = False
    try:
        c = dm.client().negotiate()
        ok_cmd(c, 'blockdev-backup', {'job-id': 'b4', 'device': 'src', 'target': 'tgt',
                                      'sync': 'top'}, tag)
        e = wait(c, 'BLOCK_JOB_COMPLETED', tag)
        if 'error' in e['data']:
            fail('%s: %r' % (tag, e))
        c.cmd('quit')
        dm.wait()
        ok = True
    finally:
        dm.cleanup(ok)
    run(['qemu-img', 'check', '-q', tgt])
    qemu_io(tgt, ['read -P 0x42 2M 1M', 'read -P 0x43 20M 64k', 'read -P 0 0 2M',
                  'read -P 0 3M 5M'])


def fleecing(kind, tmp):
    """A copy-before-write node by hand: writes through it keep the old data in the
    target, reads through it are the source's."""
    tag = kind + '-fleece'
    src, tgt = os.path.join(tmp, tag + '-src.qcow2'), os.path.join(tmp, tag + '-tgt.qcow2')
    qcow2(src)
    qemu_io(src, ['write -P 0x31 0 4M'])
    qcow2(tgt)
    d, sock = daemon(kind, tmp, tag, [('src', src), ('tgt', tgt)])
    ok = False
    try:
        c = d.client().negotiate()
        ok_cmd(c, 'block-export-del', {'id': 'e0'}, tag)
        ok_cmd(c, 'blockdev-add', {'driver': 'copy-before-write', 'node-name': 'cbw',
                                   'file': 'src', 'target': 'tgt'}, tag)
        ok_cmd(c, 'block-export-add', {'type': 'nbd', 'id': 'e2', 'node-name': 'cbw',
                                       'name': 'cbw', 'writable': True}, tag)
        end_writer(start_writer(sock, ['write -P 0x32 1M 8k', 'write -P 0x33 1M 4k',
                                       'read -P 0x33 1M 4k', 'read -P 0x32 1052672 4k',
                                       'read -P 0x31 2M 4k'], 'cbw'))
        ok_cmd(c, 'block-export-del', {'id': 'e2'}, tag)
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    # The target holds the old data of the granule written, nothing else.
    qemu_io(tgt, ['read -P 0x31 1M 64k', 'read -P 0 0 1M', 'read -P 0 2M 2M'])
    qemu_io(src, ['read -P 0x33 1M 4k', 'read -P 0x32 1052672 4k'])


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    kinds = ['ioplane'] + (['qsd'] if QSD else [])
    with tempfile.TemporaryDirectory(prefix='ioplane-backup.') as tmp:
        for kind in kinds:
            full_and_incremental(kind, tmp)
            cancel_and_kill(kind, tmp)
            top_case(kind, tmp)
            fleecing(kind, tmp)
    if not QSD:
        print('qemu-storage-daemon not installed: ioplane only')
    print('ok')


if __name__ == '__main__':
    main()
