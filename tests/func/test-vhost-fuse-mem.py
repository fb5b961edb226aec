#!/usr/bin/env python3
"""Guest memory from a file on FUSE is refused by `ioplane serve --vhost-user-blk`:
a page fault in such a mapping waits for the FUSE server, which a hostile front-end may
run and stop, and the queue's iothread would hang with every client on it. The file
here is a qemu-storage-daemon FUSE export. SET_MEM_TABLE, ADD_MEM_REG and
SET_INFLIGHT_FD with it get an error reply; the same connection then works with a
memfd, and the NBD export on the same iothread keeps serving.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nbdproto as nbd  # noqa: E402
from _vhostfe import (IOPLANE, MEM, SET_MEM_TABLE, SET_PROTOCOL_FEATURES, UVA,  # noqa: E402
                      WAIT_S, Daemon, FrontEnd, Queue, fail, handshake, wait_fd)
from _vhostfe import guest_memory  # noqa: E402

ADD_MEM_REG, SET_INFLIGHT_FD = 37, 32
PF_ALL = (1 << 0) | (1 << 3) | (1 << 9) | (1 << 12) | (1 << 15)  # + INFLIGHT, MEM_SLOTS


def skip(why):
    print('SKIP: ' + why)
    sys.exit(77)


def fuse_export(tmp):
    """A qemu-storage-daemon FUSE export of a 2 MiB file: (process, path)."""
    img, mnt = os.path.join(tmp, 'fuse.img'), os.path.join(tmp, 'fuse.mnt')
    for p in (img, mnt):
        with open(p, 'wb') as f:
            f.truncate(2 << 20 if p == img else 0)
    try:
        proc = subprocess.Popen(['qemu-storage-daemon', '--blockdev',
                                 'file,node-name=f,filename=' + img, '--export',
                                 'fuse,id=e,node-name=f,mountpoint=%s,writable=on' % mnt],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        skip('qemu-storage-daemon is not installed')
    for _ in range(100):
        if os.stat(mnt).st_dev != os.stat(tmp).st_dev:
            return proc, mnt
        if proc.poll() is not None:
            skip('qemu-storage-daemon has no working FUSE export here')
        time.sleep(0.1)
    proc.kill()
    skip('the FUSE export did not appear within 10 s')


def refused(fe, req, payload, fd, what):
    if not fe.ack(req, payload, [fd]):
        fail('%s on FUSE was accepted' % what)


def check(vs, ns, fuse_path):
    memfd, mem = guest_memory()
    fuse_fd = os.open(fuse_path, os.O_RDWR)
    fe = FrontEnd(vs)
    fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF_ALL))
    refused(fe, SET_MEM_TABLE, struct.pack('<IIQQQQ', 1, 0, 0, MEM, UVA, 0), fuse_fd,
            'SET_MEM_TABLE')
    refused(fe, ADD_MEM_REG, struct.pack('<QQQQQ', 0, 0, MEM, UVA, 0), fuse_fd, 'ADD_MEM_REG')
    refused(fe, SET_INFLIGHT_FD, struct.pack('<QQHHI', 4096, 0, 1, 16, 0), fuse_fd,
            'SET_INFLIGHT_FD')
    os.close(fuse_fd)
    # The same connection works with guest memory in a memfd.
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0x10000)
    q.offer_get_id(0x30000)
    wait_fd(q.call, 'GET_ID with memfd memory')
    fe.get_base(0)
    fe.close()
    c = nbd.Conn(types.SimpleNamespace(socket=ns, timeout=WAIT_S))
    c.handshake()
    c.go('n')
    data = os.urandom(4096)
    if c.write(0, data).error or bytes(c.read(0, 4096).data) != data:
        fail('the NBD export on the same iothread does not return what was written')
    c.close()


def main():
    if not os.access(IOPLANE, os.X_OK):
        skip('no ioplane binary at %s' % IOPLANE)
    if not os.access('/dev/fuse', os.R_OK | os.W_OK):
        skip('no /dev/fuse')
    tmp = tempfile.mkdtemp(prefix='ioplane-vhost-fuse.')
    qsd, fuse_path = fuse_export(tmp)
    vs, ns = os.path.join(tmp, 'vhost.sock'), os.path.join(tmp, 'nbd.sock')
    with open(os.path.join(tmp, 'n.img'), 'wb') as f:
        f.truncate(1 << 20)
    d = Daemon(tmp, ['--iothreads', '1', '--image', 'd,driver=null,size=64M,read-zeroes=on',
                     '--image', 'n,file=' + os.path.join(tmp, 'n.img'),
                     '--vhost-user-blk', 'unix=%s,image=d,num-queues=1' % vs,
                     '--nbd', 'unix=%s,image=n,writable=on' % ns])
    ok = False
    try:
        d.wait_socket(vs)
        d.wait_socket(ns)
        check(vs, ns, fuse_path)
        d.stop()
        ok = True
    except (nbd.Failure, nbd.Closed) as e:
        fail('NBD client: %s' % e)
    finally:
        d.cleanup(ok)
        qsd.send_signal(signal.SIGTERM)
        try:
            qsd.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            qsd.kill()
            qsd.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')
    return 0


if __name__ == '__main__':
    sys.exit(main())
