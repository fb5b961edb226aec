#!/usr/bin/env python3
"""kill -9 during a live external snapshot. Each run: `ioplane serve` exports a fresh
qcow2 image over NBD; an NBD client (_imgwork.crash: random writes, write-zeroes, trims
and flushes, several in flight) writes until it kills the daemon with SIGKILL at a random
moment, while blockdev-snapshot-sync is sent at another random moment (every other run
within 30 ms before the kill, so that kills land in the middle of snapshots). Then:
- the old image and, if it exists, the overlay pass `qemu-img check` (leaks allowed,
  as after any crash; no corruption) - no half-made overlay is ever left;
- a snapshot that was acknowledged left its overlay;
- the chain (the overlay if there is one, else the old image) reads back every request
  acknowledged before the last completed flush (_imgwork.verify).
SNAP_CRASH_RUNS overrides the number of runs (default 8).

Exit 0 pass, 77 skip, 1 fail."""
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
RUNS = int(os.environ.get('SNAP_CRASH_RUNS', '8'))


def check_ok(img):
    r = subprocess.run(['qemu-img', 'check', img], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode not in (0, 3):  # 3: leaked clusters only
        fail('qemu-img check %s: exit %d\n%s%s' % (img, r.returncode, r.stdout, r.stderr))


def one_run(tmp, run):
    rnd = random.Random(run * 7919 + 5)
    d = os.path.join(tmp, 'r%d' % run)
    os.mkdir(d)
    base, top = os.path.join(d, 'base.qcow2'), os.path.join(d, 'top.qcow2')
    sock, state = os.path.join(d, 'nbd.sock'), os.path.join(d, 'state.json')
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', base, str(SIZE)], check=True)
    dm = Daemon('ioplane', d, [
        '--blockdev', 'driver=file,filename=%s,node-name=f' % base,
        '--blockdev', 'driver=qcow2,file=f,node-name=b',
        '--object', 'iothread,id=io0',
        '--nbd-server', 'addr.type=unix,addr.path=' + sock,
        '--export', 'type=nbd,id=e,node-name=b,writable=on,iothread=io0'])
    # Every other run kills within a few milliseconds of the snapshot command, so
    # that some kills land in the middle of it.
    snap_at = round(rnd.uniform(0.1, 0.5), 3)
    if run % 2:
        kill_after = round(rnd.uniform(0.2, 1.0), 3)
    else:
        kill_after = round(snap_at + rnd.uniform(0.0, 0.03), 4)
    c = dm.client().negotiate()
    writer = threading.Thread(target=_imgwork.crash, args=(
        sock, 'b', SIZE, run + 1, dm.proc.pid, kill_after, state))
    writer.start()
    time.sleep(snap_at)
    acked = False
    try:
        r = c.cmd('blockdev-snapshot-sync', {'node-name': 'b', 'snapshot-file': top,
                                             'snapshot-node-name': 't'})
        acked = r == {'return': {}}
        if not acked:
            fail('run %d: blockdev-snapshot-sync: %r' % (run, r))
    except (Closed, OSError, TimeoutError):
        pass  # killed first
    writer.join(timeout=150)
    if writer.is_alive():
        fail('run %d: the NBD client is still running' % run)
    rc = dm.proc.wait(timeout=30)
    dm.cleanup(rc == -9)
    if rc != -9:  # the kill, not a crash of its own (a sanitizer's report)
        fail('run %d: the daemon ended with %s before it was killed' % (run, rc))
    print('run %d: kill after %.3fs, snapshot at %.3fs: %s, overlay %s' % (
        run, kill_after, snap_at, 'acknowledged' if acked else 'not acknowledged',
        'made' if os.path.exists(top) else 'absent'))
    check_ok(base)
    if acked and not os.path.exists(top):
        fail('run %d: the acknowledged snapshot left no overlay' % run)
    chain = top if os.path.exists(top) else base
    if chain == top:
        check_ok(top)
    raw = os.path.join(d, 'chain.raw')
    subprocess.run(['qemu-img', 'convert', '-O', 'raw', chain, raw], check=True, timeout=60)
    if _imgwork.verify(state, raw):
        fail('run %d: the chain lost acknowledged writes' % run)
    return acked


def main():
    if not shutil.which('qemu-img'):
        skip('qemu-img is not installed')
    acked = 0
    with tempfile.TemporaryDirectory(prefix='ioplane-snapcrash.') as tmp:
        for run in range(RUNS):
            acked += one_run(tmp, run)
    print('PASS: %d crashes, %d after an acknowledged snapshot, chains intact' % (RUNS, acked))


main()
