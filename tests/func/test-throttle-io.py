#!/usr/bin/env python3
"""I/O through throttle nodes: two NBD exports on two throttle nodes that share one
throttle group (iops-total far below what fio asks for, so that requests queue),
fio at depth 16 on both. While they run the group's limit is changed with qom-set
and one export is removed (block-export-del mode=hard, which drains its requests,
some waiting for tokens) and its throttle node deleted; both must finish. The other
fio run must end with every request done and none failed; the node's query-blockstats
counts as many requests as fio made, and its throttle wait counters have moved.
No time is asserted."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import WAIT_S, Daemon, fail, skip  # noqa: E402

FIO_S = 6


def fio(sock, name):
    return subprocess.Popen(
        # --thread: a job is a thread, so killing fio leaves no job process behind.
        ['fio', '--name=' + name, '--ioengine=nbd', '--thread',
         '--uri=nbd+unix:///%s?socket=%s' % (name, sock), '--rw=randrw', '--bs=4k',
         '--size=16M', '--iodepth=16', '--time_based', '--runtime=%d' % FIO_S,
         '--output-format=json'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)


def ok_cmd(c, name, args=None):
    r = c.cmd(name, args)
    if r != {'return': {}}:
        fail('%s %s: %r' % (name, json.dumps(args), r))


def node_stats(c, name):
    for s in c.cmd('query-blockstats', {'query-nodes': True})['return']:
        if s['node-name'] == name:
            return s['stats']
    fail('no blockstats for %s' % name)


def wait_load(c, jobs):
    """Until both fio runs have requests queued in the throttle nodes (bounded)."""
    deadline = time.monotonic() + 3 * WAIT_S
    while time.monotonic() < deadline:
        if any(j.poll() is not None for j in jobs):
            fail('fio ended before the load began: %s' % jobs[0].communicate()[1][-2000:])
        if all(node_stats(c, t)['x-ioplane']['throttle-waits'] for t in ('t0', 't1')):
            return
        time.sleep(0.1)
    fail('no request waited in both throttle nodes within %d s' % (3 * WAIT_S))


def main():
    if not shutil.which('fio'):
        skip('fio is not installed')
    if 'nbd' not in subprocess.run(['fio', '--enghelp'], capture_output=True,
                                   text=True).stdout.split():
        skip('this fio has no nbd engine')
    with tempfile.TemporaryDirectory(prefix='ioplane-thr-io.') as tmp:
        sock = os.path.join(tmp, 'nbd.sock')
        d = Daemon('ioplane', tmp, [
            '--object', 'throttle-group,id=tg,limits.iops-total=400',
            '--blockdev', 'driver=null-co,node-name=n0,size=67108864',
            '--blockdev', 'driver=null-co,node-name=n1,size=67108864',
            '--blockdev', 'driver=throttle,node-name=t0,throttle-group=tg,file=n0',
            '--blockdev', 'driver=throttle,node-name=t1,throttle-group=tg,file=n1',
            '--nbd-server', 'addr.type=unix,addr.path=' + sock,
            '--export', 'type=nbd,id=e0,node-name=t0,name=e0,writable=on',
            '--export', 'type=nbd,id=e1,node-name=t1,name=e1,writable=on'])
        ok, jobs = False, []
        try:
            c = d.client().negotiate()
            jobs = [fio(sock, 'e0'), fio(sock, 'e1')]
            wait_load(c, jobs)
            ok_cmd(c, 'qom-set', {'path': 'tg', 'property': 'limits',
                                  'value': {'iops-total': 600}})
            ok_cmd(c, 'block-export-del', {'id': 'e1', 'mode': 'hard'})
            if not c.wait_event('BLOCK_EXPORT_DELETED', {'id': 'e1'}, WAIT_S):
                fail('export e1 was not deleted under throttled load')
            ok_cmd(c, 'blockdev-del', {'node-name': 't1'})
            r = c.cmd('object-del', {'id': 'tg'})
            if 'error' not in r or 'in use' not in r['error']['desc']:
                fail('object-del of a group t0 uses: %r' % r)
            out, err = jobs[0].communicate(timeout=FIO_S + 60)
            jobs[1].communicate(timeout=60)
            if jobs[0].returncode:
                fail('fio on e0 exited %d: %s' % (jobs[0].returncode, err[-2000:]))
            job = json.loads(out[out.index('{'):])['jobs'][0]
            ios = job['read']['total_ios'] + job['write']['total_ios']
            if job['error'] or not ios:
                fail('fio on e0: error %d, %d requests' % (job['error'], ios))
            st = node_stats(c, 't0')
            done = st['rd_operations'] + st['wr_operations']
            failed = st['failed_rd_operations'] + st['failed_wr_operations']
            x = st['x-ioplane']
            if done != ios or failed or x['in-flight']:
                fail('t0 counts %d done, %d failed, %d in flight; fio made %d' % (
                    done, failed, x['in-flight'], ios))
            if not x['throttle-waits'] or not x['throttle-wait-ns']:
                fail('the throttle wait counters did not move: %r' % x)
            c.cmd('quit')
            d.wait()
            ok = True
            print('ok: %d requests through t0, %d of them waited; e1 removed under load' % (
                ios, x['throttle-waits']))
        finally:
            for j in jobs:
                if j.poll() is None:
                    j.kill()
                    j.wait()
            d.cleanup(ok)


main()
