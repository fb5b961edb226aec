#!/usr/bin/env python3
"""NBD exports run their connections on their own iothreads: with two named
iothreads a and b (and a pool iothread0 that accepts nothing of theirs), a client
of the export with iothread=a is served by a's thread, one of the export with
iothread=b by b's, and successive clients of an export with iothreads=[a, b] by a,
then b (round-robin). Which thread served is read from the CPU time of the
threads query-iothreads names (/proc/PID/task/TID/stat): the serving thread's
grows by the cost of sending 512 MiB, the other's stays near nothing. No time is
asserted, only which thread did the work.

Exit 0 pass, 77 skip, 1 fail."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import Daemon, fail, skip  # noqa: E402

SIZE = 512 << 20


def cpu_ticks(pid, tid):
    with open('/proc/%d/task/%d/stat' % (pid, tid)) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def ok(c, name, args=None):
    r = c.cmd(name, args)
    if 'return' not in r:
        fail('%s %r: %r' % (name, args, r))
    return r['return']


def copy(sock, name):
    """Read the whole export (every byte, no extents) with one connection: a null
    node without read-zeroes sends data, not holes."""
    uri = 'nbd+unix:///%s?socket=%s' % (name, sock)
    p = subprocess.run(['timeout', '120', 'nbdcopy', '--no-extents', '-C', '1', uri, 'null:'],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode:
        fail('nbdcopy %s: %s' % (name, p.stderr))


def served_by(d, sock, name, tids):
    """The iothread (a or b) whose CPU time grew while a client read export NAME."""
    before = {k: cpu_ticks(d.proc.pid, t) for k, t in tids.items()}
    copy(sock, name)
    grew = {k: cpu_ticks(d.proc.pid, t) - before[k] for k, t in tids.items()}
    best = max(grew, key=grew.get)
    others = [v for k, v in grew.items() if k != best]
    # The serving thread copied 512 MiB into a socket; the others did nothing.
    if grew[best] < 3 or any(4 * v > grew[best] for v in others):
        fail('export %s: no single iothread served it: CPU ticks %r' % (name, grew))
    return best


def main():
    if shutil.which('nbdcopy') is None:
        skip('nbdcopy is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-iot.') as tmp:
        sock = os.path.join(tmp, 'nbd.sock')
        d = Daemon('ioplane', tmp, ['--iothreads', '1'])
        good = False
        try:
            c = d.client().negotiate()
            for i in ('a', 'b'):
                ok(c, 'object-add', {'qom-type': 'iothread', 'id': i})
            tids = {t['id']: t['thread-id'] for t in ok(c, 'query-iothreads')}
            if set(tids) != {'a', 'b', 'iothread0'}:
                fail('query-iothreads: %r' % tids)
            ok(c, 'nbd-server-start', {'addr': {'type': 'unix', 'data': {'path': sock}}})
            place = {'ea': {'iothread': 'a'}, 'eb': {'iothread': 'b'},
                     'eab': {'iothreads': ['a', 'b']}}
            for name, where in place.items():
                ok(c, 'blockdev-add', {'driver': 'null-co', 'node-name': name,
                                       'size': SIZE})
                args = {'type': 'nbd', 'id': name, 'node-name': name}
                args.update(where)
                ok(c, 'block-export-add', args)
            got = [served_by(d, sock, n, tids) for n in ('ea', 'eb', 'eab', 'eab', 'ea')]
            if got != ['a', 'b', 'a', 'b', 'a']:
                fail('connections ran on %r, not on a, b, a, b, a' % got)
            good = True
        finally:
            d.cleanup(good)


main()
