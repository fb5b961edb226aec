#!/usr/bin/env python3
"""A hostile vhost-user front-end against `ioplane serve --vhost-user-blk`: malformed
messages get an error reply (REPLY_ACK) or close that connection, never the daemon; a
descriptor loop in one queue stops that queue (its error eventfd fires) while another
queue of the same device keeps serving requests; the daemon then still serves a normal
front-end (`ioplane bench --vhost-user`) and stops cleanly on SIGTERM.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import mmap
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

IOPLANE = os.environ.get('IOPLANE') or os.path.join(
    os.environ.get('IOPLANE_BUILD', 'build'), 'ioplane')
GET_FEATURES, SET_FEATURES, SET_OWNER, SET_MEM_TABLE = 1, 2, 3, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
SET_PROTOCOL_FEATURES, SET_VRING_ENABLE = 16, 18
PF = (1 << 0) | (1 << 3) | (1 << 9)  # MQ, REPLY_ACK, CONFIG
FEATURES = (1 << 32) | (1 << 30)  # VERSION_1, PROTOCOL_FEATURES
NEED_REPLY = 8
MEM = 1 << 20
UVA = 0x7f0000000000
NUM = 16


def fail(msg):
    print('FAIL:', msg)
    sys.exit(1)


class FrontEnd:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)

    def send(self, req, payload=b'', fds=(), flags=1):
        hdr = struct.pack('<III', req, flags, len(payload))
        socket.send_fds(self.s, [hdr + payload], list(fds))

    def reply(self, req):
        hdr = self.s.recv(12, socket.MSG_WAITALL)
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

    def closed(self):
        try:
            return self.s.recv(1) == b''
        except (ConnectionResetError, socket.timeout):
            return False


def wait_socket(path, proc):
    for _ in range(300):
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            fail('ioplane serve exited early: %s' % proc.stdout.read())
        time.sleep(0.1)
    fail('no socket ' + path)


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


def test_messages(path, memfd):
    fe = FrontEnd(path)
    fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF))
    # A region larger than its file, an index past the queues, features never offered:
    # error replies, and the connection stays usable.
    if not fe.ack(SET_MEM_TABLE, struct.pack('<IIQQQQ', 1, 0, 0, MEM * 64, UVA, 0), [memfd]):
        fail('a region larger than its file was accepted')
    if not fe.ack(SET_VRING_NUM, struct.pack('<II', 300, 16)):
        fail('queue index 300 was accepted')
    if not fe.ack(SET_VRING_NUM, struct.pack('<II', 0, 100)):
        fail('a queue size that is not a power of 2 was accepted')
    if not fe.ack(SET_FEATURES, struct.pack('<Q', 1 << 60)):
        fail('a feature never offered was accepted')
    if not fe.ack(SET_VRING_KICK, struct.pack('<Q', 0)):  # no fd attached
        fail('SET_VRING_KICK without an fd was accepted')
    fe.send(GET_FEATURES)
    if fe.reply(GET_FEATURES) is None:
        fail('the connection did not survive error replies')
    # Malformed framing closes the connection.
    fe.send(SET_FEATURES, b'\x01\x02\x03')
    if not fe.closed():
        fail('a SET_FEATURES with a 3-byte payload did not close the connection')
    fe = FrontEnd(path)
    fe.s.send(struct.pack('<III', GET_FEATURES, 1, 1 << 30))
    if not fe.closed():
        fail('a 1 GiB payload size did not close the connection')
    print('malformed messages: ok')


def setup_queue(fe, mem, idx, base):
    desc, avail, used = base, base + 0x400, base + 0x800
    kick = os.eventfd(0, os.EFD_NONBLOCK)
    call = os.eventfd(0, os.EFD_NONBLOCK)
    err = os.eventfd(0, os.EFD_NONBLOCK)
    fe.send(SET_VRING_NUM, struct.pack('<II', idx, NUM))
    fe.send(SET_VRING_BASE, struct.pack('<II', idx, 0))
    fe.send(SET_VRING_ADDR, struct.pack('<IIQQQQ', idx, 0, UVA + desc, UVA + used,
                                        UVA + avail, 0))
    fe.send(SET_VRING_ERR, struct.pack('<Q', idx), [err])
    fe.send(SET_VRING_CALL, struct.pack('<Q', idx), [call])
    fe.send(SET_VRING_KICK, struct.pack('<Q', idx), [kick])
    if fe.ack(SET_VRING_ENABLE, struct.pack('<II', idx, 1)):
        fail('queue %d did not start' % idx)
    return desc, avail, used, kick, call, err


def offer(mem, desc, avail, descs, kick):
    for i, (addr, ln, fl, nxt) in enumerate(descs):
        struct.pack_into('<QIHH', mem, desc + 16 * i, addr, ln, fl, nxt)
    struct.pack_into('<HHH', mem, avail, 0, 1, 0)  # flags, idx 1, ring[0] = head 0
    os.eventfd_write(kick, 1)


def wait_fd(fd, what):
    r, _, _ = select.select([fd], [], [], 10)
    if not r:
        fail('timed out waiting for ' + what)


def test_broken_queue(path, memfd, mem):
    fe = FrontEnd(path)
    handshake(fe, memfd)
    q0 = setup_queue(fe, mem, 0, 0x10000)
    q1 = setup_queue(fe, mem, 1, 0x20000)
    # Queue 0: a descriptor loop 0 -> 1 -> 0.
    offer(mem, q0[0], q0[1], [(0x30000, 16, 1, 1), (0x30010, 16, 1, 0)], q0[3])
    wait_fd(q0[5], 'the error eventfd of the looping queue')
    # Queue 1 still serves: GET_ID (type 8) through header, data, status.
    struct.pack_into('<IIQ', mem, 0x31000, 8, 0, 0)
    mem[0x31100] = 0xff
    offer(mem, q1[0], q1[1], [(0x31000, 16, 1, 1), (0x31040, 20, 3, 2), (0x31100, 1, 2, 0)],
          q1[3])
    wait_fd(q1[4], 'the completion of GET_ID on the healthy queue')
    used_idx = struct.unpack_from('<H', mem, q1[2] + 2)[0]
    if used_idx != 1 or mem[0x31100] != 0:
        fail('GET_ID on the healthy queue: used idx %d, status %d' % (used_idx, mem[0x31100]))
    if bytes(mem[0x31040:0x31040 + 7]) != b'hostile':
        fail('GET_ID returned %r' % bytes(mem[0x31040:0x31054]))
    for idx in (0, 1):
        fe.send(GET_VRING_BASE, struct.pack('<II', idx, 0))
        if fe.reply(GET_VRING_BASE) is None:
            fail('GET_VRING_BASE %d got no reply' % idx)
    fe.s.close()
    print('descriptor loop stops its queue only: ok')


def test_shrunk_memory(path, log_path):
    """The front-end truncates its memory file after SET_MEM_TABLE: touching the mapping
    would raise SIGBUS. The daemon must survive, stop that device's queue (error eventfd)
    and log why."""
    memfd = os.memfd_create('shrinking-guest')
    os.ftruncate(memfd, MEM)
    mem = mmap.mmap(memfd, MEM)
    fe = FrontEnd(path)
    handshake(fe, memfd)
    q = setup_queue(fe, mem, 0, 0x10000)
    struct.pack_into('<IIQ', mem, 0x31000, 8, 0, 0)
    descs = [(0x31000, 16, 1, 1), (0x31040, 20, 3, 2), (0x31100, 1, 2, 0)]
    for i, (addr, ln, fl, nxt) in enumerate(descs):
        struct.pack_into('<QIHH', mem, q[0] + 16 * i, addr, ln, fl, nxt)
    struct.pack_into('<HHH', mem, q[1], 0, 1, 0)
    mem.close()
    os.ftruncate(memfd, 0)
    os.eventfd_write(q[3], 1)
    wait_fd(q[5], 'the error eventfd of the queue whose memory was shrunk')
    fe.s.close()
    os.close(memfd)
    deadline = time.time() + 10
    while time.time() < deadline:
        with open(log_path) as f:
            if 'shrank guest memory' in f.read():
                break
        time.sleep(0.05)
    else:
        fail('no log line about the shrunk guest memory')
    print('memory shrunk by the front-end stops its queue, daemon lives: ok')


def main():
    if not os.access(IOPLANE, os.X_OK):
        print('SKIP: no ioplane binary at %s' % IOPLANE)
        return 77
    tmp = tempfile.mkdtemp(prefix='ioplane-vhost-hostile.')
    sock = os.path.join(tmp, 'vhost.sock')
    log_path = os.path.join(tmp, 'server.log')
    log_f = open(log_path, 'w')
    proc = subprocess.Popen([IOPLANE, 'serve', '--iothreads', '2', '--image',
                             'd,driver=null,size=64M,read-zeroes=on', '--vhost-user-blk',
                             'unix=%s,image=d,num-queues=2,writable=on,serial=hostile' % sock],
                            stdout=log_f, stderr=subprocess.STDOUT, text=True)
    ok = False
    try:
        wait_socket(sock, proc)
        memfd = os.memfd_create('hostile-guest')
        os.ftruncate(memfd, MEM)
        mem = mmap.mmap(memfd, MEM)
        test_messages(sock, memfd)
        test_broken_queue(sock, memfd, mem)
        test_shrunk_memory(sock, log_path)
        if proc.poll() is not None:
            fail('ioplane serve died (%d) after the memory was shrunk' % proc.returncode)
        out = subprocess.run([IOPLANE, 'bench', '--vhost-user', sock, '--num-queues', '2',
                              '-c', '2000', '-q'], timeout=60)
        if out.returncode:
            fail('a normal front-end failed after the hostile ones')
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=30) != 0:
            fail('ioplane serve exited %d' % proc.returncode)
        ok = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_f.close()
        with open(log_path) as f:
            log = f.read()
        if log and not ok:
            print('---- server log\n' + log[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')
    return 0


if __name__ == '__main__':
    sys.exit(main())
