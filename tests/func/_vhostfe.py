"""A vhost-user front-end driven by hand, for the tests of `ioplane serve --vhost-user-blk`
(imported by test-vhost-hostile.py and test-vhost-fds.py; stdlib only): messages with
their fds, REPLY_ACK results, guest memory in a memfd, split virtqueues set up and fed
one chain at a time, bounded waits on eventfds and on the used ring.
The leading underscore keeps the test runner (scripts/test.sh) from running it as a test.
"""
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

GET_FEATURES, SET_FEATURES, SET_OWNER, SET_MEM_TABLE = 1, 2, 3, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
SET_PROTOCOL_FEATURES, SET_VRING_ENABLE = 16, 18
PF = (1 << 0) | (1 << 3) | (1 << 9)  # MQ, REPLY_ACK, CONFIG
FEATURES = (1 << 32) | (1 << 30)  # VERSION_1, PROTOCOL_FEATURES
NEED_REPLY = 8
NOFD = 1 << 8
MEM = 1 << 20
UVA = 0x7f0000000000
NUM = 16
WAIT_S = 10
F_NEXT, F_WRITE = 1, 2


def fail(msg):
    print('FAIL:', msg)
    sys.exit(1)


class FrontEnd:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(WAIT_S)
        self.s.connect(path)

    def send(self, req, payload=b'', fds=(), flags=1):
        hdr = struct.pack('<III', req, flags, len(payload))
        socket.send_fds(self.s, [hdr + payload], list(fds))

    def reply(self, req):
        try:
            hdr = self.s.recv(12, socket.MSG_WAITALL)
        except socket.timeout:
            fail('no reply to request %d within %d s' % (req, WAIT_S))
        if len(hdr) < 12:
            return None
        r, flags, size = struct.unpack('<III', hdr)
        body = self.s.recv(size, socket.MSG_WAITALL) if size else b''
        if r != req or not flags & 4:
            fail('bad reply header %r' % ((r, flags, size),))
        return body

    def ack(self, req, payload=b'', fds=()):
        """Send with NEED_REPLY; the u64 result (0: success)."""
        self.send(req, payload, fds, 1 | NEED_REPLY)
        body = self.reply(req)
        if body is None:
            fail('connection closed instead of an error reply to request %d' % req)
        return struct.unpack('<Q', body)[0]

    def set_fd(self, req, idx, fd):
        """SET_VRING_KICK/CALL/ERR of queue idx to fd (None: the no-fd flag); the result."""
        if fd is None:
            return self.ack(req, struct.pack('<Q', idx | NOFD))
        return self.ack(req, struct.pack('<Q', idx), [fd])

    def get_base(self, idx):
        self.send(GET_VRING_BASE, struct.pack('<II', idx, 0))
        body = self.reply(GET_VRING_BASE)
        if body is None:
            fail('GET_VRING_BASE %d got no reply' % idx)
        return struct.unpack('<II', body)[1]

    def closed(self):
        try:
            return self.s.recv(1) == b''
        except (ConnectionResetError, socket.timeout):
            return False

    def close(self):
        self.s.close()


def wait_socket(path, proc):
    for _ in range(300):
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            fail('the server exited early (%d)' % proc.returncode)
        time.sleep(0.1)
    fail('no socket ' + path)


def guest_memory(name='guest', size=MEM):
    """A memfd of size bytes and its mapping: guest memory to hand the back-end."""
    memfd = os.memfd_create(name)
    os.ftruncate(memfd, size)
    return memfd, mmap.mmap(memfd, size)


def handshake(fe, memfd):
    fe.send(GET_FEATURES)
    if not struct.unpack('<Q', fe.reply(GET_FEATURES))[0] & (1 << 30):
        fail('no PROTOCOL_FEATURES')
    fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF))
    fe.send(SET_OWNER)
    if fe.ack(SET_FEATURES, struct.pack('<Q', FEATURES)):
        fail('SET_FEATURES refused')
    table = struct.pack('<IIQQQQ', 1, 0, 0, MEM, UVA, 0)
    if fe.ack(SET_MEM_TABLE, table, [memfd]):
        fail('SET_MEM_TABLE refused')


class Queue:
    """One split virtqueue of NUM entries at guest address base, chains offered by hand."""

    def __init__(self, fe, mem, idx, base, call=None, err=None, addr_flags=0, log_addr=0):
        self.fe, self.mem, self.idx = fe, mem, idx
        self.desc, self.avail, self.used = base, base + 0x400, base + 0x800
        self.kick = os.eventfd(0, os.EFD_NONBLOCK)
        self.call = os.eventfd(0, os.EFD_NONBLOCK) if call is None else call
        self.err = os.eventfd(0, os.EFD_NONBLOCK) if err is None else err
        self.avail_idx = 0
        self.next_desc = 0
        struct.pack_into('<HH', mem, self.avail, 0, 0)
        struct.pack_into('<HH', mem, self.used, 0, 0)
        fe.send(SET_VRING_NUM, struct.pack('<II', idx, NUM))
        fe.send(SET_VRING_BASE, struct.pack('<II', idx, 0))
        fe.send(SET_VRING_ADDR, struct.pack('<IIQQQQ', idx, addr_flags, UVA + self.desc,
                                            UVA + self.used, UVA + self.avail, log_addr))
        for req, fd in ((SET_VRING_ERR, self.err), (SET_VRING_CALL, self.call),
                        (SET_VRING_KICK, self.kick)):
            if fe.set_fd(req, idx, fd):
                fail('queue %d: request %d refused' % (idx, req))
        if fe.ack(SET_VRING_ENABLE, struct.pack('<II', idx, 1)):
            fail('queue %d did not start' % idx)

    def offer(self, descs, kick=True):
        """Write descs [(addr, len, flags, next)] as descriptors next_desc... (next is
        relative to the chain) and make the chain available; kick. Returns the head."""
        head = self.next_desc
        for i, (addr, ln, fl, nxt) in enumerate(descs):
            struct.pack_into('<QIHH', self.mem, self.desc + 16 * ((head + i) % NUM), addr, ln, fl,
                             (head + nxt) % NUM)
        self.next_desc = (head + len(descs)) % NUM
        struct.pack_into('<H', self.mem, self.avail + 4 + 2 * (self.avail_idx % NUM), head)
        self.avail_idx += 1
        struct.pack_into('<H', self.mem, self.avail + 2, self.avail_idx)
        if kick:
            os.eventfd_write(self.kick, 1)
        return head

    def offer_get_id(self, buf, kick=True):
        """A GET_ID request (header, 20-byte id, status) in guest memory at buf."""
        struct.pack_into('<IIQ', self.mem, buf, 8, 0, 0)
        self.mem[buf + 0x100] = 0xff
        return self.offer([(buf, 16, F_NEXT, 1), (buf + 0x40, 20, F_NEXT | F_WRITE, 2),
                           (buf + 0x100, 1, F_WRITE, 0)], kick)

    def offer_loop(self, buf):
        """A chain whose descriptors point at each other: the device must stop the queue."""
        return self.offer([(buf, 16, F_NEXT, 1), (buf + 16, 16, F_NEXT, 0)])

    def used_idx(self):
        return struct.unpack_from('<H', self.mem, self.used + 2)[0]

    def wait_used(self, n, what):
        """Poll the used ring (bounded) until n chains are used."""
        deadline = time.monotonic() + WAIT_S
        while self.used_idx() < n:
            if time.monotonic() > deadline:
                fail('%s: used index %d, not %d after %d s' % (what, self.used_idx(), n,
                                                                 WAIT_S))
            time.sleep(0.01)


def wait_fd(fd, what):
    r, _, _ = select.select([fd], [], [], WAIT_S)
    if not r:
        fail('timed out waiting for ' + what)


def readable(fd):
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)


IOPLANE = os.environ.get('IOPLANE') or os.path.join(
    os.environ.get('IOPLANE_BUILD', 'build'), 'ioplane')


class Daemon:
    """`ioplane serve ARGS` in the background with its log in tmp; wait_socket(path) waits
    for a socket of it; stop() sends SIGTERM and wants exit 0 within WAIT_S * 3."""

    def __init__(self, tmp, args, env=None, preexec=None):
        self.log_path = os.path.join(tmp, 'serve.log')
        self.log = open(self.log_path, 'w')
        self.proc = subprocess.Popen([IOPLANE, 'serve'] + args, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)

    def wait_socket(self, path):
        wait_socket(path, self.proc)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=WAIT_S * 3)
        except subprocess.TimeoutExpired:
            fail('ioplane serve still running %d s after SIGTERM' % (WAIT_S * 3))
        if rc != 0:
            fail('ioplane serve exited %d' % rc)

    def log_text(self):
        with open(self.log_path) as f:
            return f.read()

    def cleanup(self, ok):
        """Kill it if it still runs; show the end of its log when the test failed."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        log = self.log_text()
        if log and not ok:
            print('---- server log\n' + log[-3000:])


def bench(*args):
    """`ioplane bench ARGS` with a time limit; its exit status."""
    try:
        return subprocess.run([IOPLANE, 'bench'] + list(args), timeout=120).returncode
    except subprocess.TimeoutExpired:
        fail('ioplane bench %s: still running after 120 s' % ' '.join(args))
