#!/usr/bin/env python3
"""block_resize under exports: an NBD client that connects after the resize sees the new
size (one connected before keeps its negotiated size, as the protocol has it), and a
vhost-user-blk front-end that gave a back-end channel gets
VHOST_USER_BACKEND_CONFIG_CHANGE_MSG and reads the new capacity with GET_CONFIG.
Skips (77) when the daemon has no block_resize.

Exit 0 pass, 77 skip, 1 fail."""
import os
import socket
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import Daemon, fail, skip  # noqa: E402
from _vhostfe import FrontEnd  # noqa: E402

GET_FEATURES, SET_FEATURES, SET_PROTOCOL_FEATURES = 1, 2, 16
SET_BACKEND_REQ_FD, GET_CONFIG, CONFIG_CHANGE = 21, 24, 2
PF = (1 << 5) | (1 << 9)  # BACKEND_REQ, CONFIG
MiB = 1 << 20


def nbd_size(sock):
    r = subprocess.run(['nbdinfo', '--size', 'nbd+unix:///d?socket=' + sock],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if r.returncode:
        fail('nbdinfo: %s' % r.stderr)
    return int(r.stdout)


def capacity(fe):
    fe.send(GET_CONFIG, struct.pack('<III', 0, 8, 0) + bytes(8))
    body = fe.reply(GET_CONFIG)
    return struct.unpack('<Q', body[12:20])[0]


def main():
    if not subprocess.run(['which', 'nbdinfo'], capture_output=True).returncode == 0:
        skip('nbdinfo is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-resize.') as tmp:
        img = os.path.join(tmp, 'd.img')
        with open(img, 'wb') as f:
            f.truncate(8 * MiB)
        sock, vu = os.path.join(tmp, 'nbd.sock'), os.path.join(tmp, 'vu.sock')
        d = Daemon('ioplane', tmp, [
            '--image', 'd,file=%s,format=raw' % img,
            '--nbd-server', 'addr.type=unix,addr.path=' + sock,
            '--export', 'type=nbd,id=n,node-name=d',
            '--export', 'type=vhost-user-blk,id=v,node-name=d,addr.type=unix,addr.path=' + vu])
        ok = False
        try:
            c = d.client().negotiate()
            if 'block_resize' not in {x['name'] for x in c.cmd('query-commands')['return']}:
                skip('this ioplane has no block_resize')
            fe = FrontEnd(vu)
            fe.send(GET_FEATURES)
            f = struct.unpack('<Q', fe.reply(GET_FEATURES))[0]
            fe.send(SET_FEATURES, struct.pack('<Q', f))
            fe.send(SET_PROTOCOL_FEATURES, struct.pack('<Q', PF))
            ours, theirs = socket.socketpair()
            fe.send(SET_BACKEND_REQ_FD, fds=[theirs.fileno()])
            theirs.close()
            if capacity(fe) != 8 * MiB // 512 or nbd_size(sock) != 8 * MiB:
                fail('sizes before the resize')
            r = c.cmd('block_resize', {'node-name': 'd', 'size': 24 * MiB})
            if r != {'return': {}}:
                fail('block_resize: %r' % r)
            ours.settimeout(10)
            hdr = ours.recv(12, socket.MSG_WAITALL)
            if len(hdr) != 12 or struct.unpack('<III', hdr)[0] != CONFIG_CHANGE:
                fail('no BACKEND_CONFIG_CHANGE_MSG on the back-end channel: %r' % hdr)
            if capacity(fe) != 24 * MiB // 512:
                fail('capacity after the resize: %d' % capacity(fe))
            if nbd_size(sock) != 24 * MiB:
                fail('a new NBD client sees %d bytes, not 24 MiB' % nbd_size(sock))
            fe.close()
            c.cmd('quit')
            d.wait()
            ok = True
            print('ok: NBD and vhost-user-blk follow block_resize')
        finally:
            d.cleanup(ok)


if __name__ == '__main__':
    main()
