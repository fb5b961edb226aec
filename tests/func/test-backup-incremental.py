#!/usr/bin/env python3
"""The incremental backup flow as backup tools script it, against ioplane and the same
script against qemu-storage-daemon: a persistent bitmap is added; a full backup is read
over NBD (nbdcopy); the guest writes (qemu-io over NBD, scattered); at the backup point a
new bitmap starts and the old one is disabled (separate commands); an export of the
node with the old bitmap gives its dirty extents (nbdinfo --map), and only those are
read (nbdsh) into a copy of the full backup, which then equals the source (qemu-img
compare) while the full backup alone does not. The old bitmap is then cleared and
removed, and the daemon quits cleanly.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20
SIZE = 64 * MiB
# Scattered guest writes after the full backup: (offset, length, pattern).
WRITES = [((i * 7919) % 960 * 65536 + (i % 3) * 4096, 4096 * (1 + i % 5), 0x30 + i)
          for i in range(24)]


def run(*argv, ok=(0,)):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if r.returncode not in ok:
        fail('%s: exit %d: %s%s' % (' '.join(argv), r.returncode, r.stdout, r.stderr))
    return r


def qmp(c, name, args):
    r = c.cmd(name, args)
    if 'return' not in r:
        fail('%s %s: %r' % (name, json.dumps(args), r))
    return r['return']


def dirty_extents(uri, ctx):
    out = run('nbdinfo', '--json', '--map=' + ctx, uri).stdout
    return [(e['offset'], e['length']) for e in json.loads(out) if e['type'] & 1]


COPY = '''
import os
h.connect_uri(os.environ['BK_URI'])
with open(os.environ['BK_FILE'], 'r+b') as f:
    for a in os.environ['BK_EXTENTS'].split():
        off, n = map(int, a.split(':'))
        while n:
            k = min(n, 4 << 20)
            f.seek(off)
            f.write(h.pread(k, off))
            off += k
            n -= k
'''


def flow(kind, tmp):
    src = os.path.join(tmp, kind + '-src.qcow2')
    run('qemu-img', 'create', '-q', '-f', 'qcow2', src, str(SIZE))
    run('qemu-io', '-f', 'qcow2', '-c', 'write -P 0x11 0 8M', '-c', 'write -P 0x12 40M 3M', src)
    sock = os.path.join(tmp, kind + '.sock')
    d = Daemon(kind, tmp, ['--blockdev', 'driver=file,filename=%s,node-name=f' % src,
                           '--blockdev', 'driver=qcow2,file=f,node-name=q',
                           '--nbd-server', 'addr.type=unix,addr.path=' + sock,
                           '--export', 'type=nbd,id=e,node-name=q,name=d,writable=on'])
    uri = 'nbd+unix:///d?socket=' + sock
    ok = False
    try:
        c = d.client().negotiate()
        qmp(c, 'block-dirty-bitmap-add', {'node': 'q', 'name': 'b0', 'persistent': True})
        full = os.path.join(tmp, kind + '-full.raw')
        run('nbdcopy', uri, full)
        for off, n, pat in WRITES:
            run('qemu-io', '-f', 'raw', '-c', 'write -P %d %d %d' % (pat, off, n), uri)
        # The backup point: the next backup's bitmap starts, this one stops.
        qmp(c, 'block-dirty-bitmap-add', {'node': 'q', 'name': 'b1', 'persistent': True})
        qmp(c, 'block-dirty-bitmap-disable', {'node': 'q', 'name': 'b0'})
        qmp(c, 'block-export-add', {'type': 'nbd', 'id': 'bk', 'node-name': 'q',
                                    'name': 'backup', 'bitmaps': ['b0']})
        bk = 'nbd+unix:///backup?socket=' + sock
        ext = dirty_extents(bk, 'qemu:dirty-bitmap:b0')
        dirty = sum(n for _, n in ext)
        written = sum(n for _, n, _ in WRITES)
        if not written <= dirty < SIZE // 4:
            fail('%s: %d dirty bytes for %d written' % (kind, dirty, written))
        inc = os.path.join(tmp, kind + '-inc.raw')
        shutil.copy(full, inc)
        os.environ.update(BK_URI=bk, BK_FILE=inc,
                          BK_EXTENTS=' '.join('%d:%d' % e for e in ext))
        run(*NBDSH, '-c', COPY)
        run('qemu-img', 'compare', '-f', 'raw', '-F', 'raw', inc, bk)
        run('qemu-img', 'compare', '-f', 'raw', '-F', 'raw', full, bk, ok=(1,))
        qmp(c, 'block-export-del', {'id': 'bk'})
        # The bitmap is the export's until it is gone.
        if not c.wait_event('BLOCK_EXPORT_DELETED', {'id': 'bk'}):
            fail('%s: no BLOCK_EXPORT_DELETED' % kind)
        qmp(c, 'block-dirty-bitmap-clear', {'node': 'q', 'name': 'b0'})
        qmp(c, 'block-dirty-bitmap-remove', {'node': 'q', 'name': 'b0'})
        qmp(c, 'quit', {})
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    info = json.loads(run('qemu-img', 'info', '--output=json', src).stdout)
    names = [b['name'] for b in info['format-specific']['data'].get('bitmaps', [])]
    if names != ['b1']:
        fail('%s: bitmaps left in the image: %s' % (kind, names))
    run('qemu-img', 'check', src)
    return ext


def nbdsh():
    """nbdsh run by a python3 that has libnbd's module (the system's, not another
    python3 first on PATH), or None."""
    path = shutil.which('nbdsh')
    for py in ('/usr/bin/python3', sys.executable):
        if path and os.access(py, os.X_OK) and subprocess.run(
                [py, '-c', 'import nbd'], capture_output=True).returncode == 0:
            return [py, '-m', 'nbd']  # what nbdsh runs
    return None


NBDSH = nbdsh()


def main():
    for tool in ('nbdcopy', 'nbdinfo', 'qemu-io'):
        if not shutil.which(tool):
            skip('%s is not installed' % tool)
    if not NBDSH:
        skip('nbdsh (python3-libnbd) is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-backup.') as tmp:
        kinds = ['ioplane'] + (['qsd'] if QSD else [])
        got = {k: flow(k, tmp) for k in kinds}
        if QSD and got['ioplane'] != got['qsd']:
            fail('dirty extents: ioplane %s, qsd %s' % (got['ioplane'], got['qsd']))
    print('incremental backup: %d dirty extents read, restored image equals the source (%s)'
          % (len(got['ioplane']), ', '.join(kinds)))


if __name__ == '__main__':
    main()
