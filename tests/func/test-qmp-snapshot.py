#!/usr/bin/env python3
"""External snapshots over QMP, the same script against qemu-storage-daemon and
`ioplane serve`, with an NBD export whose client stays connected throughout:

1. blockdev-snapshot-sync, blockdev-snapshot and transaction: every reply (errors:
   unknown nodes, a missing or taken overlay node-name, an overlay that already has a
   backing image, grouped completion, a transaction whose second action fails) is the
   same; after a failed transaction nothing changed (the export still serves the old
   node); after each snapshot the export serves the overlay (query-block-exports) and
   the old top is read-only in query-named-block-nodes.
2. Data lands in the right layer: what was written before a snapshot is in the old
   image, what was written after is in the overlay only; every image passes
   `qemu-img check`; the chain reads back every write.
3. Locks: before the snapshot `qemu-img info` (without -U) cannot open the image the
   daemon writes; afterwards it can open the old top, now a read-only backing file,
   and not the overlay - with both daemons.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, same_transcripts, skip  # noqa: E402

MiB = 1 << 20


def run(argv, ok=True):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    if ok and r.returncode:
        fail('%s: %s%s' % (' '.join(argv), r.stdout, r.stderr))
    return r


def qemu_io(target, *cmds, fmt='raw'):
    argv = ['qemu-io', '-f', fmt]
    for c in cmds:
        argv += ['-c', c]
    r = run(argv + [target], ok=False)
    if r.returncode or 'Pattern verification failed' in r.stdout or 'failed' in r.stdout:
        fail('qemu-io %s %s: %s%s' % (target, cmds, r.stdout, r.stderr))


def nodes(c):
    """The named nodes: node-name -> (driver, ro), generated names left out."""
    r = c.cmd('query-named-block-nodes', {'flat': True})['return']
    return {n['node-name']: (n['drv'], n['ro']) for n in r if not n['node-name'].startswith('#')}


def export_node(c):
    return [x['node-name'] for x in c.cmd('query-block-exports')['return']]


def script(kind, tmp):
    """Run the script against one daemon; returns the transcript (dir names replaced)."""
    d = os.path.join(tmp, kind)
    os.mkdir(d)
    base, sock = os.path.join(d, 'base.qcow2'), os.path.join(d, 'nbd.sock')
    run(['qemu-img', 'create', '-q', '-f', 'qcow2', base, '64M'])
    qemu_io(base, 'write -P 0x11 0 1M', fmt='qcow2')
    uri = 'nbd+unix:///base?socket=' + sock
    dm = Daemon(kind, d)
    out = []
    ok = False
    try:
        c = dm.client().negotiate()

        def cmd(name, args=None):
            r = c.cmd(name, args)
            out.append((name, json.loads(json.dumps(r).replace(d, '$D'))))
            return r

        def want_ok(name, args=None):
            r = cmd(name, args)
            if r != {'return': {}}:
                fail('%s %s: %s' % (kind, name, r))

        want_ok('blockdev-add', {'driver': 'qcow2', 'node-name': 'base',
                                 'file': {'driver': 'file', 'filename': base}})
        want_ok('nbd-server-start', {'addr': {'type': 'unix', 'data': {'path': sock}}})
        want_ok('block-export-add', {'type': 'nbd', 'id': 'e0', 'node-name': 'base',
                                     'writable': True})
        locked = run(['qemu-img', 'info', base], ok=False).returncode != 0
        out.append(('base locked while written', locked))
        qemu_io(uri, 'write -P 0x22 1M 1M')
        o1, o2, o3 = (os.path.join(d, n + '.qcow2') for n in ('o1', 'o2', 'o3'))
        # Refused, nothing changes.
        cmd('blockdev-snapshot-sync', {'node-name': 'nope', 'snapshot-file': o1,
                                       'snapshot-node-name': 'o1'})
        cmd('blockdev-snapshot-sync', {'node-name': 'base', 'snapshot-file': o1})
        cmd('blockdev-snapshot-sync', {'node-name': 'base', 'snapshot-file': o1,
                                       'snapshot-node-name': 'base'})
        cmd('blockdev-snapshot-sync', {'node-name': 'base', 'snapshot-file': o1 + '.raw',
                                       'snapshot-node-name': 'r', 'format': 'raw'})
        cmd('blockdev-snapshot', {'node': 'base', 'overlay': 'nope'})
        cmd('blockdev-snapshot', {'node': 'nope', 'overlay': 'base'})
        act = {'type': 'blockdev-snapshot-sync',
               'data': {'node-name': 'base', 'snapshot-file': o1, 'snapshot-node-name': 'o1'}}
        cmd('transaction', {'actions': [act], 'properties': {'completion-mode': 'grouped'}})
        cmd('transaction', {'actions': [act, {'type': 'blockdev-snapshot-sync', 'data': {
            'node-name': 'nope', 'snapshot-file': o2, 'snapshot-node-name': 'o2'}}]})
        out.append(('exports after a failed transaction', export_node(c)))
        out.append(('nodes after a failed transaction', nodes(c)))
        # The first snapshot, in a transaction with a new bitmap (the backup tools'
        # point in time): the bitmap's drain must not hold the snapshot's flush.
        want_ok('transaction', {'actions': [
            {'type': 'block-dirty-bitmap-add', 'data': {'node': 'base', 'name': 'b0'}}, act]})
        out.append(('exports', export_node(c)))
        out.append(('nodes', nodes(c)))
        out.append(('base readable by others', run(['qemu-img', 'info', base],
                                                   ok=False).returncode == 0))
        out.append(('o1 locked', run(['qemu-img', 'info', o1], ok=False).returncode != 0))
        qemu_io(uri, 'read -P 0x11 0 1M', 'read -P 0x22 1M 1M', 'write -P 0x33 2M 1M')
        # The second, with an overlay made by blockdev-add.
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', o1, '-F', 'qcow2', o2])
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', o3])
        want_ok('blockdev-add', {'driver': 'qcow2', 'node-name': 'o2', 'backing': None,
                                 'file': {'driver': 'file', 'filename': o2}})
        want_ok('blockdev-add', {'driver': 'qcow2', 'node-name': 'o3',
                                 'file': {'driver': 'file', 'filename': o3}})
        cmd('blockdev-snapshot', {'node': 'o1', 'overlay': 'o3'})
        o5 = os.path.join(d, 'o5.qcow2')
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', o5, '64M'])
        want_ok('blockdev-add', {'driver': 'qcow2', 'node-name': 'o5',
                                 'file': {'driver': 'file', 'filename': o5}})
        cmd('blockdev-snapshot', {'node': 'o5', 'overlay': 'o5'})  # a cycle
        want_ok('blockdev-snapshot', {'node': 'o1', 'overlay': 'o2'})
        out.append(('exports 2', export_node(c)))
        out.append(('nodes 2', nodes(c)))
        qemu_io(uri, 'read -P 0x11 0 1M', 'read -P 0x22 1M 1M', 'read -P 0x33 2M 1M',
                'write -P 0x44 3M 1M')
        # The third: an overlay made beforehand (mode existing), opened by the daemon.
        o4 = os.path.join(d, 'o4.qcow2')
        run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-b', o2, '-F', 'qcow2', o4])
        want_ok('blockdev-snapshot-sync', {'node-name': 'o2', 'snapshot-file': o4,
                                           'snapshot-node-name': 'o4', 'mode': 'existing'})
        out.append(('exports 3', export_node(c)))
        qemu_io(uri, 'read -P 0x44 3M 1M', 'write -P 0x55 4M 1M')
        c.cmd('quit')
        dm.wait()
        ok = True
    finally:
        dm.cleanup(ok)
    for img in (base, o1, o2, o4):
        run(['qemu-img', 'check', '-q', img])
    qemu_io(o4, 'read -P 0x44 3M 1M', 'read -P 0x55 4M 1M', 'read -P 0x11 0 1M', fmt='qcow2')
    qemu_io(o2, 'read -P 0 4M 1M', fmt='qcow2')
    # Each write in its layer, and the chain reads every one.
    qemu_io(base, 'read -P 0x11 0 1M', 'read -P 0x22 1M 1M', 'read -P 0 2M 2M', fmt='qcow2')
    qemu_io(o1, 'read -P 0x33 2M 1M', 'read -P 0 3M 1M', fmt='qcow2')
    qemu_io(o2, 'read -P 0x11 0 1M', 'read -P 0x22 1M 1M', 'read -P 0x33 2M 1M',
            'read -P 0x44 3M 1M', fmt='qcow2')
    m = json.loads(run(['qemu-img', 'map', '--output=json', o2]).stdout)
    top = [e for e in m if e['depth'] == 0 and e['data']]
    if [(e['start'], e['length']) for e in top] != [(3 * MiB, MiB)]:
        fail('%s: the overlay allocates %s, not just the write made after the snapshot'
             % (kind, top))
    return out


def main():
    for t in ('qemu-img', 'qemu-io'):
        if not shutil.which(t):
            skip('%s is not installed' % t)
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-snap.') as tmp:
        mine, theirs = script('ioplane', tmp), script('qsd', tmp)
    same_transcripts(mine, theirs)


main()
