#!/usr/bin/env python3
"""File descriptors from a hostile vhost-user front-end, against `ioplane serve` with one
iothread that also serves an NBD client and a second vhost-user-blk export:

1. The error, call and kick eventfds of running queues are replaced (call also by "no
   fd"): the queue uses the new ones, and the old ones are closed only once its thread is
   done with them. When the queue then breaks, the new error eventfd fires and no stray
   bytes reach the NBD clients that connected meanwhile (their sockets get the numbers of
   the fds closed); their data, and the other export's, still verify.
2. An fd that is not an eventfd (pipe, socket, regular file, /dev/null, memfd) is refused
   as kick, call or error fd; the connection stays usable.
3. Call and error eventfds whose counter the front-end left at its maximum, blocking on
   its side: the iothread never waits for them. The NBD client on it is served while
   both writes are pending; the waiting call arrives once the front-end reads its counter;
   GET_VRING_BASE stops the queue; the next front-end is served; SIGTERM ends the daemon
   while another front-end's writes are pending.

Each part under the io_uring and the epoll event loop.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import select
import shutil
import socket
import struct
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _nbdproto as nbd  # noqa: E402
from _vhostfe import (GET_FEATURES, IOPLANE, MEM, SET_VRING_CALL, SET_VRING_ERR,  # noqa: E402
                      SET_VRING_KICK, WAIT_S, Daemon, FrontEnd, Queue, bench, fail,
                      handshake, readable, wait_fd)
from _vhostfe import guest_memory  # noqa: E402

SATURATED = 0xfffffffffffffffe  # the largest value an eventfd counter holds


def nbd_connect(path):
    """An NBD client past the server's greeting: the daemon has accepted its socket."""
    c = nbd.Conn(types.SimpleNamespace(socket=path, timeout=WAIT_S))
    c.greet()
    return c


def nbd_finish_and_check(c, off):
    """Finish c's handshake and check a write and read at off."""
    cf = nbd.C_FIXED_NEWSTYLE | (nbd.C_NO_ZEROES if c.hflags & nbd.FLAG_NO_ZEROES else 0)
    c.send(struct.pack('>I', cf))
    c.no_zeroes = bool(cf & nbd.C_NO_ZEROES)
    c.go('n')
    nbd_check_io(c, off)


def nbd_check_io(c, off):
    data = os.urandom(64 << 10)
    if c.write(off, data).error:
        fail('NBD write at %d failed' % off)
    r = c.read(off, len(data))
    if r.error or bytes(r.data) != data:
        fail('NBD read at %d does not return what was written' % off)


def no_stray_bytes(conns):
    for c in conns:
        if readable(c.s):
            fail('stray bytes reached an NBD client: %r' % c.s.recv(64, socket.MSG_PEEK))


def other_export(path, pattern):
    """The second vhost-user export still works: written data reads back."""
    common = ['--vhost-user', path, '--num-queues', '1', '-c', '2000', '--verify',
              '--pattern', str(pattern), '-q']
    if bench(*(common + ['-w'])) or bench(*common):
        fail('the other vhost-user export failed')


def part_replace(vs, ns, vs2, memfd, mem):
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    q0 = Queue(fe, mem, 0, 0x10000)
    q1 = Queue(fe, mem, 1, 0x20000)
    old_call = q0.call
    new_err, new_call, new_kick = (os.eventfd(0, os.EFD_NONBLOCK) for _ in range(3))
    for req, fd in ((SET_VRING_KICK, new_kick), (SET_VRING_CALL, new_call),
                    (SET_VRING_ERR, new_err)):
        if fe.set_fd(req, 0, fd):
            fail('replacing fd %d of a running queue was refused' % req)
    if fe.set_fd(SET_VRING_CALL, 1, None):
        fail('replacing the call fd of a running queue by "no fd" was refused')
    q0.kick, q0.call, q0.err = new_kick, new_call, new_err
    # Clients that connect now get the fd numbers the daemon closed.
    conns = [nbd_connect(ns) for _ in range(4)]
    q0.offer_get_id(0x30000)
    wait_fd(q0.call, 'the replaced call eventfd')
    if readable(old_call):
        fail('the old call eventfd was signalled after it was replaced')
    q1.offer_get_id(0x31000)
    q1.wait_used(1, 'queue 1 without a call fd')
    # Break queue 0: its new error eventfd must fire, and nothing else.
    q0.offer_loop(0x32000)
    r, _, _ = select.select([q0.err] + [c.s for c in conns], [], [], WAIT_S)
    no_stray_bytes(conns)
    if q0.err not in r:
        fail('the replaced error eventfd did not fire when the queue broke')
    for i, c in enumerate(conns):
        nbd_finish_and_check(c, i << 20)
        c.close()
    other_export(vs2, 21)
    if fe.set_fd(SET_VRING_ERR, 0, None) or fe.set_fd(SET_VRING_CALL, 0, None):
        fail('"no fd" for the error or call fd of a broken queue was refused')
    fe.get_base(0)
    fe.get_base(1)
    fe.close()
    print('fds replaced on running queues: ok')


def not_eventfds(tmp):
    """(name, fd) of every kind of fd that is not an eventfd."""
    r, w = os.pipe()
    s1, s2 = socket.socketpair()
    path = os.path.join(tmp, 'regular')
    with open(path, 'wb') as f:
        f.write(b'x' * 4096)
    memfd = os.memfd_create('not-an-eventfd')
    os.ftruncate(memfd, 4096)
    fds = [('pipe', r), ('pipe', w), ('socket', s1.detach()),
           ('regular file', os.open(path, os.O_RDWR)),
           ('/dev/null', os.open('/dev/null', os.O_RDWR)), ('memfd', memfd)]
    return fds, [s2]


def part_types(vs, memfd, tmp):
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    fds, keep = not_eventfds(tmp)
    for name, fd in fds:
        for req in (SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR):
            if not fe.set_fd(req, 0, fd):
                fail('a %s was accepted by request %d' % (name, req))
    fe.send(GET_FEATURES)
    if fe.reply(GET_FEATURES) is None:
        fail('the connection did not survive the refused fds')
    for _, fd in fds:
        os.close(fd)
    del keep
    fe.close()
    print('fds that are not eventfds are refused: ok')


def saturated():
    """A blocking eventfd whose counter is at its maximum: a write of 1 would wait."""
    fd = os.eventfd(0)
    os.eventfd_write(fd, SATURATED)
    return fd


def wait_log(d, text, seen):
    """Wait until the daemon's log has text more than `seen` times."""
    deadline = time.monotonic() + WAIT_S
    while d.log_text().count(text) <= seen:
        if time.monotonic() > deadline:
            fail('no log line with %r' % text)
        time.sleep(0.02)


def part_saturated(d, vs, ns, memfd, mem):
    conn = nbd_connect(ns)
    nbd_finish_and_check(conn, 0)
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0x10000, call=saturated(), err=saturated())
    q.offer_get_id(0x30000)
    q.wait_used(1, 'GET_ID with a saturated call eventfd')
    nbd_check_io(conn, 1 << 20)
    # Reading the counter lets the waiting call through: not lost, just late.
    if os.eventfd_read(q.call) != SATURATED:
        fail('the saturated call eventfd changed before the front-end read it')
    wait_fd(q.call, 'the call that waited for the saturated counter')
    if os.eventfd_read(q.call) != 1:
        fail('the call that waited did not arrive as one')
    os.eventfd_write(q.call, SATURATED)
    q.offer_get_id(0x31000)
    q.wait_used(2, 'the second GET_ID')
    seen = d.log_text().count('bad descriptor chain')
    q.offer_loop(0x32000)
    wait_log(d, 'bad descriptor chain', seen)
    nbd_check_io(conn, 2 << 20)  # the iothread is not stuck writing either
    fe.get_base(0)               # the stop does not wait for the writes
    fe.close()
    conn.close()
    if bench('--vhost-user', vs, '--num-queues', '2', '-c', '2000', '-q'):
        fail('the next front-end was not served')
    # Writes pending when the daemon is told to stop: SIGTERM still ends it.
    fe = FrontEnd(vs)
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0x10000, call=saturated(), err=saturated())
    q.offer_get_id(0x30000)
    q.wait_used(1, 'GET_ID before SIGTERM')
    seen = d.log_text().count('bad descriptor chain')
    q.offer_loop(0x32000)
    wait_log(d, 'bad descriptor chain', seen)
    d.stop()
    fe.close()
    print('saturated call and error eventfds never block: ok')


def run(tmp, backend):
    vs, vs2, ns = (os.path.join(tmp, n) for n in ('vhost.sock', 'vhost2.sock', 'nbd.sock'))
    for name in ('n.img', 'e.img'):
        with open(os.path.join(tmp, name), 'wb') as f:
            f.truncate(16 << 20)
    env = dict(os.environ, IOPLANE_LOOP_BACKEND=backend)
    d = Daemon(tmp, ['--iothreads', '1', '--image', 'd,driver=null,size=64M,read-zeroes=on',
                     '--image', 'n,file=' + os.path.join(tmp, 'n.img'),
                     '--image', 'e,file=' + os.path.join(tmp, 'e.img'),
                     '--vhost-user-blk', 'unix=%s,image=d,num-queues=2,writable=on' % vs,
                     '--vhost-user-blk', 'unix=%s,image=e,num-queues=1,writable=on' % vs2,
                     '--nbd', 'unix=%s,image=n,writable=on' % ns], env)
    ok = False
    try:
        for s in (vs, vs2, ns):
            d.wait_socket(s)
        memfd, mem = guest_memory()
        part_replace(vs, ns, vs2, memfd, mem)
        part_types(vs, memfd, tmp)
        part_saturated(d, vs, ns, memfd, mem)  # stops the daemon
        ok = True
    finally:
        d.cleanup(ok)
    print('%s loop: ok' % backend)


def main():
    if not os.access(IOPLANE, os.X_OK):
        print('SKIP: no ioplane binary at %s' % IOPLANE)
        return 77
    for backend in ('uring', 'epoll'):
        tmp = tempfile.mkdtemp(prefix='ioplane-vhost-fds.')
        try:
            run(tmp, backend)
        except (nbd.Failure, nbd.Closed) as e:
            fail('NBD client: %s' % e)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')
    return 0


if __name__ == '__main__':
    sys.exit(main())
