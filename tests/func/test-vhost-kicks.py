#!/usr/bin/env python3
"""No kick is lost, against `ioplane serve --poll-max-ns 0` (no polling: only kicks make
the queue look at its avail ring), one iothread, a hand-driven vhost-user front-end:

1. Many requests one at a time, each made available and then kicked: every one is
   answered (the io_uring loop takes kicks as completions of one multishot poll of the
   kick eventfd that is never read; each kick must still give one).
2. A kick eventfd whose counter is already high when the queue starts (left by an
   earlier owner): the queue works.
3. A stopped queue (GET_VRING_BASE) is offered a request and kicked while stopped, then
   started again with the same kick eventfd: the pending request is answered and so are
   the ones kicked after it. Twice, so that a second stop must end the new wait too.
4. The kick eventfd of a running queue is replaced (SET_VRING_KICK): requests kicked on
   the new one are answered; kicks on the old one do no harm.

Each part under the io_uring and the epoll event loop, then, with the same script,
against qemu-storage-daemon's vhost-user-blk export (when it is installed).
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _vhostfe import (IOPLANE, SET_VRING_BASE, SET_VRING_CALL, SET_VRING_KICK,  # noqa: E402
                      Daemon, FrontEnd, Queue, fail, guest_memory, handshake, wait_socket)

MANY = 300
BUF = 0x30000


def one(q, what):
    """One GET_ID request, kicked, answered (the ring is reused from descriptor 0)."""
    q.next_desc = 0
    q.offer_get_id(BUF)
    q.wait_used(q.avail_idx, what)


def restart(fe, q, base):
    """Start queue 0 again after GET_VRING_BASE: its base, its call fd, then its kick fd.
    libvhost-user (qemu-storage-daemon 7.2) closes both fds at GET_VRING_BASE and drops
    the connection when a kick that is already pending at SET_VRING_KICK completes a
    request before the call fd comes (writing the closed call fd), as QEMU's order
    (kick, then call) allows; ioplane, which closes them too, then sends no call.
    True if refused."""
    return bool(fe.ack(SET_VRING_BASE, struct.pack('<II', 0, base)) or
                fe.set_fd(SET_VRING_CALL, 0, q.call) or fe.set_fd(SET_VRING_KICK, 0, q.kick))


def part_many(fe, mem):
    q = Queue(fe, mem, 0, 0x10000)
    for i in range(MANY):
        one(q, 'request %d of %d, one kick each' % (i + 1, MANY))
    print('%d requests, one kick each: ok' % MANY)
    return q


def part_high_counter(vs, memfd, mem):
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0x10000)
    fe.get_base(0)
    os.eventfd_write(q.kick, 1 << 62)
    if restart(fe, q, q.avail_idx):
        fail('restarting a queue with a high kick counter was refused')
    for i in range(20):
        one(q, 'request %d after a high kick counter' % (i + 1))
    fe.get_base(0)
    fe.close()
    print('kick counter high at start: ok')


def part_stop_start(fe, q):
    for cycle in range(2):
        fe.get_base(0)
        used = q.used_idx()
        q.next_desc = 0
        q.offer_get_id(BUF)  # kicked while stopped
        if q.used_idx() != used:
            fail('a stopped queue answered a request')
        if restart(fe, q, used):
            fail('restarting the queue was refused')
        q.wait_used(q.avail_idx, 'the request kicked while stopped (cycle %d)' % cycle)
        for i in range(20):
            one(q, 'request %d after restart %d' % (i + 1, cycle))
    print('stop, kick while stopped, restart: ok')


def part_replace(fe, q):
    old = q.kick
    q.kick = os.eventfd(0, os.EFD_NONBLOCK)
    if fe.set_fd(SET_VRING_KICK, 0, q.kick):
        fail('replacing the kick fd of a running queue was refused')
    for i in range(50):
        os.eventfd_write(old, 1)
        one(q, 'request %d on the replaced kick fd' % (i + 1))
    os.close(old)
    for i in range(20):
        one(q, 'request %d after the old kick fd was closed' % (i + 1))
    print('kick fd replaced: ok')


def parts(vs):
    """The four parts against the back-end listening at vs."""
    memfd, mem = guest_memory()
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    q = part_many(fe, mem)
    part_stop_start(fe, q)
    part_replace(fe, q)
    fe.get_base(0)
    fe.close()
    part_high_counter(vs, memfd, mem)


def run(tmp, backend):
    vs = os.path.join(tmp, 'vhost.sock')
    env = dict(os.environ, IOPLANE_LOOP_BACKEND=backend)
    d = Daemon(tmp, ['--iothreads', '1', '--poll-max-ns', '0',
                     '--image', 'd,driver=null,size=64M,read-zeroes=on',
                     '--vhost-user-blk', 'unix=%s,image=d,num-queues=1' % vs], env)
    ok = False
    try:
        d.wait_socket(vs)
        parts(vs)
        d.stop()
        ok = True
    finally:
        d.cleanup(ok)
    print('%s loop: ok' % backend)


def run_qsd(tmp):
    qsd = shutil.which('qemu-storage-daemon')
    if not qsd:
        print('qemu-storage-daemon not installed: the same script was not run against it')
        return
    vs = os.path.join(tmp, 'qsd.sock')
    log_path = os.path.join(tmp, 'qsd.log')
    with open(log_path, 'w') as log:
        p = subprocess.Popen([qsd, '--blockdev',
                              'driver=null-co,node-name=d,size=67108864,read-zeroes=on',
                              '--export', 'type=vhost-user-blk,id=e,node-name=d,'
                              'addr.type=unix,addr.path=%s,num-queues=1' % vs],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_socket(vs, p)
        parts(vs)
    finally:
        p.kill()
        p.wait()
    print('qemu-storage-daemon: ok')


def main():
    if not os.access(IOPLANE, os.X_OK):
        print('SKIP: no ioplane binary at %s' % IOPLANE)
        return 77
    tmp = tempfile.mkdtemp(prefix='ioplane-vhost-kicks.')
    try:
        for backend in ('uring', 'epoll'):
            run(tmp, backend)
        run_qsd(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')
    return 0


if __name__ == '__main__':
    sys.exit(main())
