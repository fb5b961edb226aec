#!/usr/bin/env python3
"""Dirty logging for live migration (VHOST_F_LOG_ALL, LOG_SHMFD), driven by hand as QEMU
does it, against `ioplane serve` and, with the same script, qemu-storage-daemon's
vhost-user-blk export (libvhost-user):

1. The back-end offers VHOST_F_LOG_ALL and LOG_SHMFD; SET_LOG_BASE with a memfd gets its
   u64 reply. With LOG_ALL on and the used ring's log address given (VHOST_VRING_F_LOG), a
   read request marks exactly the pages it wrote: its data buffer, its status byte and the
   used ring; not the page of its header (which the device only reads) nor any other.
2. SET_FEATURES without LOG_ALL: requests mark nothing more.
3. (ioplane) A SET_LOG_BASE whose range the fd does not cover, or with no fd, closes that
   connection with a logged error; the daemon serves the next front-end.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import mmap
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _vhostfe import (F_NEXT, F_WRITE, GET_FEATURES, MEM, SET_FEATURES,  # noqa: E402
                      SET_MEM_TABLE, SET_OWNER, SET_PROTOCOL_FEATURES, UVA, WAIT_S, Daemon,
                      FrontEnd, Queue, fail, wait_socket)
from _vhostfe import guest_memory  # noqa: E402

GET_PROTOCOL_FEATURES, SET_LOG_BASE = 15, 6
PF_LOG_SHMFD = 1 << 1
PF = (1 << 0) | (1 << 3) | (1 << 9)  # MQ, REPLY_ACK, CONFIG
LOG_ALL = 1 << 26
FEATURES = (1 << 32) | (1 << 30)  # VERSION_1, PROTOCOL_FEATURES
RING = 0x1000                     # guest address of the ring (pages 1..)
HDR, DATA, STATUS = 0x30000, 0x10000, 0x20000
PAGES = MEM // 4096


def setup(path, log_size=PAGES // 8):
    """A front-end on path with logging set up; (fe, mem, log, logmap)."""
    fe = FrontEnd(path)
    fe.send(GET_FEATURES)
    feats = struct.unpack('<Q', fe.reply(GET_FEATURES))[0]
    if not feats & LOG_ALL:
        fail('VHOST_F_LOG_ALL not offered (features %#x)' % feats)
    fe.send(GET_PROTOCOL_FEATURES)
    pf = struct.unpack('<Q', fe.reply(GET_PROTOCOL_FEATURES))[0]
    if not pf & PF_LOG_SHMFD:
        fail('LOG_SHMFD not offered (protocol features %#x)' % pf)
    fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF | PF_LOG_SHMFD))
    fe.send(SET_OWNER)
    if fe.ack(SET_FEATURES, struct.pack('<Q', FEATURES | LOG_ALL)):
        fail('SET_FEATURES with LOG_ALL refused')
    memfd, mem = guest_memory()
    if fe.ack(SET_MEM_TABLE, struct.pack('<IIQQQQ', 1, 0, 0, MEM, UVA, 0), [memfd]):
        fail('SET_MEM_TABLE refused')
    logfd = os.memfd_create('log')
    os.ftruncate(logfd, 4096)
    logmap = mmap.mmap(logfd, 4096)
    fe.send(SET_LOG_BASE, struct.pack('<QQ', log_size, 0), [logfd])
    body = fe.reply(SET_LOG_BASE)
    if body is None or len(body) != 8:
        fail('SET_LOG_BASE: no u64 reply (%r)' % (body,))
    os.close(logfd)
    os.close(memfd)
    return fe, mem, logmap


def dirty(logmap):
    return {p for p in range(PAGES) if logmap[p // 8] & (1 << (p % 8))}


def read_req(q, mem, sector):
    struct.pack_into('<IIQ', mem, HDR, 0, 0, sector)  # VIRTIO_BLK_T_IN
    mem[STATUS] = 0xff
    n = q.used_idx()
    q.offer([(HDR, 16, F_NEXT, 1), (DATA, 4096, F_NEXT | F_WRITE, 2),
             (STATUS, 1, F_WRITE, 0)])
    q.wait_used(n + 1, 'read of sector %d' % sector)
    if mem[STATUS] != 0:
        fail('read of sector %d: status %d' % (sector, mem[STATUS]))


def check_logging(who, path):
    fe, mem, logmap = setup(path)
    q = Queue(fe, mem, 0, RING, addr_flags=1, log_addr=RING + 0x800)
    logmap[:] = bytes(4096)  # what ring start-up marked is not what we look at
    read_req(q, mem, 8)
    got = dirty(logmap)
    want = {DATA // 4096, STATUS // 4096, (RING + 0x800) // 4096}
    if not want <= got:
        fail('%s: pages %s not marked dirty (marked: %s)' % (who, sorted(want - got), sorted(got)))
    if HDR // 4096 in got or got - want - {RING // 4096}:
        fail('%s: pages marked that the device did not write: %s' % (who, sorted(got - want)))
    print('%s: a read marked pages %s' % (who, sorted(got)))
    if fe.ack(SET_FEATURES, struct.pack('<Q', FEATURES)):
        fail('%s: SET_FEATURES without LOG_ALL refused' % who)
    logmap[:] = bytes(4096)
    read_req(q, mem, 16)
    if dirty(logmap):
        fail('%s: pages marked with logging off: %s' % (who, sorted(dirty(logmap))))
    print('%s: logging off: nothing marked' % who)
    fe.close()


def check_bad_log(path, d):
    for what, size, fds in (('a range past the fd', 1 << 20, True), ('no fd', 32, False)):
        fe = FrontEnd(path)
        fe.send(GET_FEATURES)
        fe.reply(GET_FEATURES)
        fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF | PF_LOG_SHMFD))
        fe.send(SET_OWNER)
        logfd = os.memfd_create('log')
        os.ftruncate(logfd, 4096)
        fe.send(SET_LOG_BASE, struct.pack('<QQ', size, 0), [logfd] if fds else [])
        os.close(logfd)
        if fe.reply(SET_LOG_BASE) is not None:
            fail('SET_LOG_BASE with %s got a reply' % what)
        if not d.alive():
            fail('the daemon died on SET_LOG_BASE with %s' % what)
        fe.close()
    if 'SET_LOG_BASE' not in d.log_text():
        fail('the refused SET_LOG_BASE is not in the log')
    print('ioplane: bad SET_LOG_BASE messages close their connection, the daemon goes on')


def main():
    tmp = tempfile.mkdtemp(prefix='vhost-log-')
    img = os.path.join(tmp, 'disk.raw')
    with open(img, 'wb') as f:
        f.truncate(64 << 20)
    path = os.path.join(tmp, 'vhost.sock')
    d = Daemon(tmp, ['--image', 'd,file=%s,format=raw' % img,
                     '--vhost-user-blk', 'unix=%s,image=d,num-queues=1' % path])
    ok = False
    try:
        d.wait_socket(path)
        check_logging('ioplane', path)
        check_bad_log(path, d)
        check_logging('ioplane (next front-end)', path)
        d.stop()
        ok = True
    finally:
        d.cleanup(ok)
    qsd = shutil.which('qemu-storage-daemon')
    if not qsd:
        print('qemu-storage-daemon not installed: the same script was not run against it')
    else:
        qpath = os.path.join(tmp, 'qsd.sock')
        log = open(os.path.join(tmp, 'qsd.log'), 'w')
        p = subprocess.Popen([qsd, '--blockdev', 'driver=file,node-name=d,filename=' + img,
                              '--export', 'type=vhost-user-blk,id=e,node-name=d,'
                              'addr.type=unix,addr.path=%s,num-queues=1' % qpath],
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_socket(qpath, p)
            check_logging('qemu-storage-daemon', qpath)
        finally:
            p.kill()
            p.wait()
            log.close()
    shutil.rmtree(tmp)
    print('PASS')


if __name__ == '__main__':
    try:
        main()
    except socket.timeout:
        fail('no answer within %d s' % WAIT_S)
