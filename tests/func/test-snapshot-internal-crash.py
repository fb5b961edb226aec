#!/usr/bin/env python3
"""kill -9 during internal qcow2 snapshots. Each run: `ioplane serve` exports a fresh
qcow2 image over NBD; an NBD client (_imgwork.crash: random writes, write-zeroes, trims
and flushes, several in flight) writes until it kills the daemon with SIGKILL at a random
moment, while QMP creates and deletes internal snapshots one after the other
(blockdev-snapshot-internal-sync, blockdev-snapshot-delete-internal-sync), so that kills
land in the middle of them. Then:
- `qemu-img check` accepts the image (leaks allowed, as after any crash; on a version 3
  image the dirty bit may be set, and then what qemu-img check -r all repairs is allowed
  too: that is what the bit says, and what QEMU and ioplane do when they open it);
- every snapshot acknowledged and not deleted since is in the table, every deletion
  acknowledged is done, and each snapshot reads back whole (qemu-img convert -l);
- the active image reads back every request acknowledged before the last completed
  flush (_imgwork.verify).
ISNAP_CRASH_RUNS overrides the number of runs (default 8).

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _imgwork  # noqa: E402
from _qmp import Closed, Daemon, fail, skip  # noqa: E402

SIZE = 16 << 20
RUNS = int(os.environ.get('ISNAP_CRASH_RUNS', '8'))


def qimg(*argv, ok=(0,)):
    r = subprocess.run(['qemu-img'] + list(argv), capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode not in ok:
        fail('qemu-img %s: exit %d\n%s%s' % (' '.join(argv), r.returncode, r.stdout,
                                             r.stderr))
    return r


def dirty(img):
    info = json.loads(qimg('info', '--output=json', img).stdout)
    return info.get('dirty-flag', False)


def check_ok(img, run):
    r = qimg('check', img, ok=(0, 2, 3))
    if r.returncode == 2:
        if not dirty(img):
            fail('run %d: corruption without the dirty bit:\n%s%s' % (run, r.stdout,
                                                                       r.stderr))
        qimg('check', '-r', 'all', img, ok=(0,))
        qimg('check', img, ok=(0,))
        return 'repaired (dirty bit set)'
    return 'clean' if r.returncode == 0 else 'leaks'


def snapshots(img):
    info = json.loads(qimg('info', '--output=json', '-U', img).stdout)
    return [s['name'] for s in info.get('snapshots', [])]


def snapper(c, rnd, log):
    """Create and delete snapshots until the daemon dies; log: (op, name, acked)."""
    live, n = [], 0
    try:
        while n < 40:
            time.sleep(rnd.uniform(0.0, 0.05))
            if live and (len(live) > 2 or rnd.random() < 0.4):
                name = live.pop(rnd.randrange(len(live)))
                log.append(['delete', name, False])
                r = c.cmd('blockdev-snapshot-delete-internal-sync',
                          {'device': 'b', 'name': name})
                log[-1][2] = 'return' in r
            else:
                n += 1
                name = 's%d' % n
                log.append(['create', name, False])
                r = c.cmd('blockdev-snapshot-internal-sync', {'device': 'b', 'name': name})
                log[-1][2] = r == {'return': {}}
                if log[-1][2]:
                    live.append(name)
            if not log[-1][2]:
                fail('%s %s: %r' % (log[-1][0], log[-1][1], r))
    except (Closed, OSError, TimeoutError):
        pass  # killed


def one_run(tmp, run):
    rnd = random.Random(run * 7919 + 11)
    d = os.path.join(tmp, 'r%d' % run)
    os.mkdir(d)
    img = os.path.join(d, 'img.qcow2')
    sock, state = os.path.join(d, 'nbd.sock'), os.path.join(d, 'state.json')
    opts = rnd.choice(['compat=1.1', 'compat=0.10', 'lazy_refcounts=on', 'extended_l2=on'])
    qimg('create', '-q', '-f', 'qcow2', '-o', opts, img, str(SIZE))
    dm = Daemon('ioplane', d, [
        '--blockdev', 'driver=file,filename=%s,node-name=f' % img,
        '--blockdev', 'driver=qcow2,file=f,node-name=b',
        '--object', 'iothread,id=io0',
        '--nbd-server', 'addr.type=unix,addr.path=' + sock,
        '--export', 'type=nbd,id=e,node-name=b,writable=on,iothread=io0'])
    kill_after = round(rnd.uniform(0.2, 1.2), 3)
    c = dm.client().negotiate()
    writer = threading.Thread(target=_imgwork.crash, args=(
        sock, 'b', SIZE, run + 1, dm.proc.pid, kill_after, state))
    writer.start()
    log = []
    snapper(c, rnd, log)
    writer.join(timeout=150)
    if writer.is_alive():
        fail('run %d: the NBD client is still running' % run)
    rc = dm.proc.wait(timeout=30)
    dm.cleanup(rc == -9)
    if rc != -9:  # the kill, not a crash of its own (a sanitizer's report)
        fail('run %d: the daemon ended with %s before it was killed' % (run, rc))
    how = check_ok(img, run)
    have = snapshots(img)
    want = set()
    for op, name, acked in log:
        if op == 'create' and acked:
            want.add(name)
        elif op == 'delete' and acked:
            want.discard(name)
    pending = log[-1][1] if log and not log[-1][2] else None
    if set(have) - {pending} != want - {pending}:
        fail('run %d: snapshots %s, acknowledged %s (pending %s)' % (run, have, sorted(want),
                                                                   pending))
    for name in have:
        qimg('convert', '-O', 'raw', '-l', 'snapshot.name=' + name, img,
             os.path.join(d, name + '.raw'))
    raw = os.path.join(d, 'active.raw')
    qimg('convert', '-O', 'raw', img, raw)
    if _imgwork.verify(state, raw):
        fail('run %d: the image lost acknowledged writes' % run)
    print('run %d (%s): kill after %.3fs, %d snapshot operations, %d acknowledged, check %s'
          % (run, opts, kill_after, len(log), sum(1 for x in log if x[2]), how))
    return sum(1 for x in log if x[2])


def main():
    if not shutil.which('qemu-img'):
        skip('qemu-img is not installed')
    acked = 0
    with tempfile.TemporaryDirectory(prefix='ioplane-isnapcrash.') as tmp:
        for run in range(RUNS):
            acked += one_run(tmp, run)
    print('PASS: %d crashes, %d snapshot operations acknowledged, images intact'
          % (RUNS, acked))


main()
