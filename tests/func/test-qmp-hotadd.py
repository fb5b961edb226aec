#!/usr/bin/env python3
"""Exports come and go while another one is under load: a running `ioplane serve` gets
50 NBD and 50 vhost-user-blk exports added over QMP and removed again while fio writes
and verifies (crc32c, verify_backlog) through a third export. Checked: every added
export serves (qemu-io reads its data over NBD, a vhost-user front-end gets its
features), every removed one is gone and its BLOCK_EXPORT_DELETED reaches both monitor
clients, a node in use cannot be deleted with its iothread, and fio - still running
when the last export has gone - ends without an error, its data verified.

Exit 0 pass, 77 skip, 1 fail."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import Daemon, fail, skip  # noqa: E402
from _vhostfe import GET_FEATURES, FrontEnd  # noqa: E402

N = 50
PATTERN = 0x3c
FIO_S = 30


def fio_cmd(tmp, sock):
    return ['fio', '--name=load', '--ioengine=nbd', '--thread',
            '--uri=nbd+unix:///load?socket=' + sock,
            '--rw=randwrite', '--bs=4k', '--size=8M', '--numjobs=2', '--offset_increment=8M',
            '--iodepth=16', '--verify=crc32c', '--verify_fatal=1', '--verify_backlog=128',
            '--time_based', '--runtime=%d' % FIO_S, '--group_reporting',
            '--output-format=json', '--directory=' + tmp]


def qemu_io_reads(sock, name):
    r = subprocess.run(['qemu-io', '-r', '-f', 'raw', '-c', 'read -P 0x%x 0 4k' % PATTERN,
                        'nbd+unix:///%s?socket=%s' % (name, sock)], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    return r.returncode == 0 and 'read 4096/4096' in r.stdout


def vhost_features(path):
    fe = FrontEnd(path)
    fe.send(GET_FEATURES)
    body = fe.reply(GET_FEATURES)
    fe.close()
    return struct.unpack('<Q', body)[0] if body and len(body) == 8 else None


def events_deleted(c, want, deadline):
    got = set()
    for eid in sorted(want):
        if c.wait_event('BLOCK_EXPORT_DELETED', {'id': eid},
                        max(deadline - time.monotonic(), 0.1)):
            got.add(eid)
    return got


def ok_cmd(c, name, args=None):
    r = c.cmd(name, args)
    if r != {'return': {}}:
        fail('%s %r: %r' % (name, args, r))


def hot(c, c2, tmp, sock):
    ok_cmd(c, 'object-add', {'qom-type': 'iothread', 'id': 'hot'})
    for i in range(N):
        ok_cmd(c, 'block-export-add', {'type': 'nbd', 'id': 'n%d' % i, 'node-name': 'ro',
                                       'name': 'ro%d' % i, 'iothread': 'hot'})
        ok_cmd(c, 'block-export-add', {'type': 'vhost-user-blk', 'id': 'v%d' % i,
                                       'node-name': 'ro', 'iothread': 'hot',
                                       'addr': {'type': 'unix',
                                                'path': os.path.join(tmp, 'v%d.sock' % i)}})
    ids = {e['id'] for e in c.cmd('query-block-exports')['return']}
    want = {'n%d' % i for i in range(N)} | {'v%d' % i for i in range(N)}
    if not want <= ids:
        fail('query-block-exports lacks %s' % sorted(want - ids)[:5])
    for i in range(0, N, 10):
        if not qemu_io_reads(sock, 'ro%d' % i):
            fail('hot-added NBD export ro%d does not serve its data' % i)
        if vhost_features(os.path.join(tmp, 'v%d.sock' % i)) is None:
            fail('hot-added vhost-user-blk export v%d does not answer' % i)
    r = c.cmd('object-del', {'id': 'hot'})
    if 'error' not in r:
        fail('object-del of an iothread 100 exports run on: %r' % r)
    for i in range(N):
        ok_cmd(c, 'block-export-del', {'id': 'n%d' % i})
        ok_cmd(c, 'block-export-del', {'id': 'v%d' % i, 'mode': 'hard' if i % 2 else 'safe'})
    deadline = time.monotonic() + 30
    for cl in (c, c2):
        got = events_deleted(cl, want, deadline)
        if not want <= got:
            fail('BLOCK_EXPORT_DELETED missing for %s' % sorted(want - got)[:5])
    left = {e['id'] for e in c.cmd('query-block-exports')['return']}
    if left != {'load'}:
        fail('exports left after the removals: %s' % sorted(left))
    if qemu_io_reads(sock, 'ro0') or os.path.exists(os.path.join(tmp, 'v0.sock')):
        fail('a removed export still serves')
    ok_cmd(c, 'object-del', {'id': 'hot'})


def main():
    for tool in ('fio', 'qemu-io'):
        if not shutil.which(tool):
            skip('%s is not installed' % tool)
    if 'nbd' not in subprocess.run(['fio', '--enghelp'], capture_output=True,
                                   text=True).stdout.split():
        skip('this fio has no nbd engine')
    with tempfile.TemporaryDirectory(prefix='ioplane-hotadd.') as tmp:
        load, ro = os.path.join(tmp, 'load.img'), os.path.join(tmp, 'ro.img')
        with open(load, 'wb') as f:
            f.truncate(16 << 20)
        with open(ro, 'wb') as f:
            f.write(bytes([PATTERN]) * (4 << 20))
        sock = os.path.join(tmp, 'nbd.sock')
        d = Daemon('ioplane', tmp, [
            '--image', 'load,file=%s,format=raw' % load,
            '--image', 'ro,file=%s,format=raw,read-only=on' % ro,
            '--nbd-server', 'addr.type=unix,addr.path=' + sock,
            '--export', 'type=nbd,id=load,node-name=load,writable=on'])
        ok = False
        fio = None
        try:
            c, c2 = d.client().negotiate(), d.client().negotiate()
            fio = subprocess.Popen(fio_cmd(tmp, sock), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            time.sleep(1)  # fio connected and writing
            hot(c, c2, tmp, sock)
            if fio.poll() is not None:
                fail('fio ended before the exports were removed: the load did not overlap')
            out, err = fio.communicate(timeout=FIO_S + 120)
            if fio.returncode:
                fail('fio exited %d: %s %s' % (fio.returncode, out[-2000:], err[-2000:]))
            j = json.loads(out[out.index('{'):])['jobs'][0]
            if j['error'] or not j['write']['io_kbytes'] or not j['read']['io_kbytes']:
                fail('fio: error %d, written %d KiB, verified %d KiB' % (
                    j['error'], j['write']['io_kbytes'], j['read']['io_kbytes']))
            print('ok: 2x%d exports added and removed; fio wrote %d KiB, verified %d KiB' % (
                N, j['write']['io_kbytes'], j['read']['io_kbytes']))
            ok_cmd(c, 'quit')
            d.wait()
            ok = True
        finally:
            if fio and fio.poll() is None:
                fio.kill()
                fio.wait()
            d.cleanup(ok)


if __name__ == '__main__':
    main()
