#!/usr/bin/env python3
"""Dirty bitmaps over QMP, the same script against ioplane and qemu-storage-daemon:
block-dirty-bitmap-add/-remove/-clear/-enable/-disable/-merge replies (errors word for
word), the dirty-bitmaps of query-named-block-nodes after writes over NBD (qemu-io), and
persistence both ways: what one daemon saved at quit, the other loads with the same
counts; qemu-img info lists it and qemu-img check accepts the image. A daemon killed
with SIGKILL leaves its bitmaps in use: both daemons and qemu-img report them
inconsistent, and refuse to use them.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, skip  # noqa: E402

MiB = 1 << 20


def run(*argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    if r.returncode:
        fail('%s: %s' % (' '.join(argv), r.stderr))
    return r.stdout


def start(kind, tmp, img):
    sock = os.path.join(tmp, kind + '.sock')
    d = Daemon(kind, tmp, [
        '--blockdev', 'driver=file,filename=%s,node-name=f' % img,
        '--blockdev', 'driver=qcow2,file=f,node-name=q,discard=unmap',
        '--nbd-server', 'addr.type=unix,addr.path=' + sock,
        '--export', 'type=nbd,id=e,node-name=q,name=d,writable=on'])
    return d, d.client().negotiate(), 'nbd+unix:///d?socket=' + sock


def bitmaps(c, node='q'):
    for n in c.cmd('query-named-block-nodes')['return']:
        if n['node-name'] == node:
            return sorted(n.get('dirty-bitmaps', []), key=lambda b: b['name'])
    fail('no node %s' % node)


# (command, arguments): errors and successes, in order, on node q (qcow2, 64 MiB) and
# f (its file node).
SCRIPT = [
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'b1'}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'b1'}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': ''}),
    ('block-dirty-bitmap-add', {'node': 'nope', 'name': 'x'}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'g', 'granularity': 1000}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'g', 'granularity': 256}),
    ('block-dirty-bitmap-add', {'node': 'f', 'name': 'p', 'persistent': True}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'p', 'persistent': True,
                                'granularity': 4096}),
    ('block-dirty-bitmap-add', {'node': 'q', 'name': 'dis', 'disabled': True,
                                'persistent': True}),
    ('block-dirty-bitmap-add', {'node': 'f', 'name': 'fb'}),
]
SCRIPT2 = [
    ('block-dirty-bitmap-remove', {'node': 'q', 'name': 'zz'}),
    ('block-dirty-bitmap-remove', {'node': 'nope', 'name': 'zz'}),
    ('block-dirty-bitmap-merge', {'node': 'q', 'target': 'dis',
                                  'bitmaps': ['b1', {'node': 'q', 'name': 'p'}]}),
    ('block-dirty-bitmap-merge', {'node': 'q', 'target': 'dis', 'bitmaps': ['nope']}),
    ('block-dirty-bitmap-merge', {'node': 'q', 'target': 'nope', 'bitmaps': ['b1']}),
    ('block-dirty-bitmap-merge', {'node': 'q', 'target': 'dis',
                                  'bitmaps': [{'node': 'f', 'name': 'fb'}]}),
    ('block-dirty-bitmap-clear', {'node': 'q', 'name': 'b1'}),
    ('block-dirty-bitmap-clear', {'node': 'q', 'name': 'nope'}),
    ('block-dirty-bitmap-enable', {'node': 'q', 'name': 'dis'}),
    ('block-dirty-bitmap-disable', {'node': 'q', 'name': 'b1'}),
    ('block-dirty-bitmap-disable', {'node': 'q', 'name': 'dis'}),
    ('block-dirty-bitmap-remove', {'node': 'q', 'name': 'b1'}),
    # The same actions in transactions: all or nothing (the bitmaps after are compared).
    ('transaction', {'actions': [
        {'type': 'block-dirty-bitmap-add', 'data': {'node': 'q', 'name': 't1'}},
        {'type': 'block-dirty-bitmap-clear', 'data': {'node': 'q', 'name': 'dis'}}]}),
    ('transaction', {'actions': [
        {'type': 'block-dirty-bitmap-add', 'data': {'node': 'q', 'name': 't2'}},
        {'type': 'block-dirty-bitmap-add', 'data': {'node': 'q', 'name': 't2'}}]}),
    ('transaction', {'actions': [
        {'type': 'block-dirty-bitmap-disable', 'data': {'node': 'q', 'name': 't1'}},
        {'type': 'block-dirty-bitmap-remove', 'data': {'node': 'q', 'name': 'nope'}}]}),
    ('transaction', {'actions': [
        {'type': 'block-dirty-bitmap-merge',
         'data': {'node': 'q', 'target': 't1', 'bitmaps': ['dis']}},
        {'type': 'block-dirty-bitmap-add', 'data': {'node': 'nope', 'name': 'x'}}]}),
]


def session(kind, tmp):
    """Run the script; returns what must be the same for both daemons."""
    img = os.path.join(tmp, kind + '.qcow2')
    run('qemu-img', 'create', '-q', '-f', 'qcow2', img, '64M')
    run('qemu-img', 'bitmap', '--add', img, 'old')
    d, c, uri = start(kind, tmp, img)
    ok = False
    out = []
    try:
        out += [c.cmd(n, a) for n, a in SCRIPT]
        run('qemu-io', '-f', 'raw', '-c', 'write 0 64k', '-c', 'write 1M 4k',
            '-c', 'write -z 5M 100k', '-c', 'discard 40M 1M', uri)
        # The file node's bitmap sees the qcow2 driver's own writes too: only the
        # format node's are compared.
        out.append(bitmaps(c))
        # The file nodes' sizes differ (each driver lays the image out its own way).
        out += [json.loads(re.sub(r'source size is \d+', 'source size is N',
                                  json.dumps(c.cmd(n, a)))) for n, a in SCRIPT2]
        out.append(bitmaps(c))
        run('qemu-io', '-f', 'raw', '-c', 'write 10M 64k', uri)
        out.append(bitmaps(c))
        if c.cmd('quit') != {'return': {}}:
            fail('%s: quit' % kind)
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    return img, out


def reopen(kind, tmp, img):
    """Open an image the other daemon saved: its bitmaps as loaded."""
    d, c, _ = start(kind, tmp, img)
    ok = False
    try:
        got = bitmaps(c)
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    return got


def crash(kind, tmp, img):
    """kill -9 with the image open: the bitmaps stay in use."""
    d, c, uri = start(kind, tmp, img)
    try:
        run('qemu-io', '-f', 'raw', '-c', 'write 20M 64k', uri)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
    finally:
        d.cleanup(True)
    info = json.loads(run('qemu-img', 'info', '--output=json', '-U', img))
    return info['format-specific']['data']['bitmaps']


def main():
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    if not shutil.which('qemu-io'):
        skip('qemu-io is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-bitmaps.') as tmp:
        imgs, outs = {}, {}
        for kind in ('qsd', 'ioplane'):
            imgs[kind], outs[kind] = session(kind, tmp)
        for i, (q, io) in enumerate(zip(outs['qsd'], outs['ioplane'])):
            if q != io:
                fail('step %d: qsd said %s, ioplane %s' % (i, json.dumps(q), json.dumps(io)))
        saved = outs['ioplane'][-1]
        want = [dict(b, recording=b['recording'], busy=False)
                for b in saved if b['persistent']]
        for kind in ('qsd', 'ioplane'):
            info = run('qemu-img', 'info', imgs[kind])
            for b in want:
                if 'name: %s' % b['name'] not in info:
                    fail('qemu-img info of the image %s saved lacks bitmap %s:\n%s'
                         % (kind, b['name'], info))
            run('qemu-img', 'check', imgs[kind])
        # Both ways: each daemon loads what the other saved, with the same counts.
        for saver, loader in (('ioplane', 'qsd'), ('qsd', 'ioplane')):
            got = reopen(loader, tmp, imgs[saver])
            if got != want:
                fail('%s loaded what %s saved as %s, want %s'
                     % (loader, saver, json.dumps(got), json.dumps(want)))
        # A crash leaves the bitmaps in use; reported as QEMU reports them.
        flags = crash('ioplane', tmp, imgs['ioplane'])
        if not all('in-use' in b['flags'] for b in flags):
            fail('after kill -9 the bitmaps are not in use: %s' % json.dumps(flags))
        for kind in ('qsd', 'ioplane'):
            img = os.path.join(tmp, 'crashed-%s.qcow2' % kind)
            shutil.copy(imgs['ioplane'], img)
            d, c, _ = start(kind, tmp, img)
            try:
                got = bitmaps(c)
                if not got or not all(b.get('inconsistent') and not b['recording'] for b in got):
                    fail('%s: in-use bitmaps not reported inconsistent: %s'
                         % (kind, json.dumps(got)))
                outs[kind] = [c.cmd('block-dirty-bitmap-clear', {'node': 'q', 'name': 'p'}),
                              c.cmd('block-dirty-bitmap-enable', {'node': 'q', 'name': 'p'}),
                              c.cmd('block-dirty-bitmap-remove', {'node': 'q', 'name': 'p'}),
                              bitmaps(c)]
                c.cmd('quit')
                d.wait()
            finally:
                d.cleanup(True)
            # Leaked clusters (exit 3) are what a kill -9 may leave; not errors.
            r = subprocess.run(['qemu-img', 'check', img], capture_output=True, text=True,
                               timeout=60, stdin=subprocess.DEVNULL)
            if r.returncode not in (0, 3):
                fail('qemu-img check after the crash: %s%s' % (r.stdout, r.stderr))
        if outs['qsd'] != outs['ioplane']:
            fail('inconsistent bitmaps: qsd %s, ioplane %s'
                 % (json.dumps(outs['qsd']), json.dumps(outs['ioplane'])))
    print('bitmaps: %d QMP steps as qsd; saved and loaded both ways; kill -9 leaves them '
          'inconsistent' % (len(SCRIPT) + len(SCRIPT2)))


if __name__ == '__main__':
    main()
