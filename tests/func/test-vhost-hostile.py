#!/usr/bin/env python3
"""A hostile vhost-user front-end against `ioplane serve --vhost-user-blk`: malformed
messages get an error reply (REPLY_ACK) or close that connection, never the daemon; a
descriptor loop in one queue stops that queue (its error eventfd fires) while another
queue of the same device, which also got bad ring messages, keeps serving requests; the daemon then still serves a normal
front-end (`ioplane bench --vhost-user`) and stops cleanly on SIGTERM.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _vhostfe import (GET_FEATURES, IOPLANE, MEM, SET_FEATURES, SET_MEM_TABLE,  # noqa: E402
                      SET_PROTOCOL_FEATURES, SET_VRING_BASE, SET_VRING_KICK, SET_VRING_NUM, PF,
                      UVA, Daemon, FrontEnd, Queue, bench, fail, handshake, wait_fd)
from _vhostfe import guest_memory  # noqa: E402


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


def test_broken_queue(path, memfd, mem):
    fe = FrontEnd(path)
    handshake(fe, memfd)
    q0 = Queue(fe, mem, 0, 0x10000)
    q1 = Queue(fe, mem, 1, 0x20000)
    # Bad ring messages for a running queue are refused and leave it running.
    if not fe.ack(SET_VRING_NUM, struct.pack('<II', 1, 100)):
        fail('a queue size that is not a power of 2 was accepted')
    if not fe.ack(SET_VRING_BASE, struct.pack('<II', 1, 0x10000)):
        fail('a ring base above 0xffff was accepted')
    q0.offer_loop(0x30000)
    wait_fd(q0.err, 'the error eventfd of the looping queue')
    # Queue 1 still serves: GET_ID (type 8) through header, data, status.
    q1.offer_get_id(0x31000)
    wait_fd(q1.call, 'the completion of GET_ID on the healthy queue')
    if q1.used_idx() != 1 or mem[0x31100] != 0:
        fail('GET_ID on the healthy queue: used idx %d, status %d' % (q1.used_idx(),
                                                                      mem[0x31100]))
    if bytes(mem[0x31040:0x31040 + 7]) != b'hostile':
        fail('GET_ID returned %r' % bytes(mem[0x31040:0x31054]))
    for idx in (0, 1):
        fe.get_base(idx)
    fe.s.close()
    print('descriptor loop stops its queue only: ok')


def test_shrunk_memory(path, log_path):
    """The front-end truncates its memory file after SET_MEM_TABLE: touching the mapping
    would raise SIGBUS. The daemon must survive, stop that device's queue (error eventfd)
    and log why."""
    memfd, mem = guest_memory('shrinking-guest')
    fe = FrontEnd(path)
    handshake(fe, memfd)
    q = Queue(fe, mem, 0, 0x10000)
    q.offer_get_id(0x31000, kick=False)  # the kick comes after the shrink
    mem.close()
    os.ftruncate(memfd, 0)
    os.eventfd_write(q.kick, 1)
    wait_fd(q.err, 'the error eventfd of the queue whose memory was shrunk')
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
    d = Daemon(tmp, ['--iothreads', '2', '--image', 'd,driver=null,size=64M,read-zeroes=on',
                     '--vhost-user-blk',
                     'unix=%s,image=d,num-queues=2,writable=on,serial=hostile' % sock])
    ok = False
    try:
        d.wait_socket(sock)
        memfd, mem = guest_memory('hostile-guest')
        test_messages(sock, memfd)
        test_broken_queue(sock, memfd, mem)
        test_shrunk_memory(sock, d.log_path)
        if not d.alive():
            fail('ioplane serve died (%d) after the memory was shrunk' % d.proc.returncode)
        if bench('--vhost-user', sock, '--num-queues', '2', '-c', '2000', '-q'):
            fail('a normal front-end failed after the hostile ones')
        d.stop()
        ok = True
    finally:
        d.cleanup(ok)
        shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')
    return 0


if __name__ == '__main__':
    sys.exit(main())
