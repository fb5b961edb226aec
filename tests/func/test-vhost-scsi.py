#!/usr/bin/env python3
"""`ioplane serve --export type=vhost-user-scsi` driven by a hand-made virtio-scsi driver:
INQUIRY, REPORT LUNS (LUNs from luns=[...]), READ CAPACITY, data written through WRITE (10)
read back and found in the image file, UNMAP and WRITE SAME (16) with UNMAP reading back
zeroes, SYNCHRONIZE CACHE, MODE SENSE's write cache bit, CHECK CONDITION with fixed sense
for an unknown operation code, an LBA past the end and a missing LUN, BAD_TARGET for
target 1; task management on the control queue, a LUN reset waiting for a slow READ; a
LUN hot-added and removed over QMP (x-vhost-user-scsi-lun-add/-remove) with its
transport reset events on the event queue; block-export-add with luns over QMP and the
LUN commands' errors; RESET_DEVICE as QEMU sends it;
a chain without room for the response stops that queue only; then `ioplane bench
--vhost-user --scsi --verify` on the same export and a clean stop.
Exit 0 pass, 77 skip, 1 fail (scripts/test.sh conventions)."""
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import Daemon  # noqa: E402
from _vhostfe import (F_NEXT, F_WRITE, MEM, SET_FEATURES, SET_MEM_TABLE, UVA,  # noqa: E402
                      FrontEnd, Queue, bench, fail, readable, wait_fd)
from _vhostfe import guest_memory  # noqa: E402
import _vhostfe  # noqa: E402

HOTPLUG = 1 << 1
HDR, RESP = 51, 108
IMG_SIZE = 4 << 20


RESET_DEVICE = 34
PF_RESET_DEVICE = 1 << 13


def handshake(fe, memfd):
    fe.send(_vhostfe.GET_FEATURES)
    feat = struct.unpack('<Q', fe.reply(_vhostfe.GET_FEATURES))[0]
    if not feat & HOTPLUG:
        fail('VIRTIO_SCSI_F_HOTPLUG not offered')
    fe.send(_vhostfe.SET_PROTOCOL_FEATURES, struct.pack('<Q', _vhostfe.PF | PF_RESET_DEVICE))
    fe.send(_vhostfe.SET_OWNER)
    if fe.ack(SET_FEATURES, struct.pack('<Q', _vhostfe.FEATURES | HOTPLUG)):
        fail('SET_FEATURES refused')
    if fe.ack(SET_MEM_TABLE, struct.pack('<IIQQQQ', 1, 0, 0, MEM, UVA, 0), [memfd]):
        fail('SET_MEM_TABLE refused')


def offer(q, descs):
    """Queue.offer with the chain kept inside the descriptor table (every earlier
    chain is used by now)."""
    if q.next_desc + len(descs) > _vhostfe.NUM:
        q.next_desc = 0
    return q.offer(descs)


class Scsi:
    """Commands on one request queue; each uses the 4 KiB at BUF (header, response at
    +0x100, data at +0x400)."""
    BUF = 0x40000

    def __init__(self, q, mem):
        self.q, self.mem, self.n = q, mem, 0

    def cmd(self, cdb, lun=0, data_out=b'', data_in=0, target=0, resp_len=RESP):
        b = self.BUF
        hdr = bytes([1, target, 0x40 | (lun >> 8), lun & 0xff, 0, 0, 0, 0])
        hdr += struct.pack('<QBBB', self.n, 0, 0, 0) + cdb.ljust(32, b'\0')
        self.mem[b:b + HDR] = hdr
        self.mem[b + 0x100:b + 0x100 + RESP] = b'\xee' * RESP
        descs = [(b, HDR, F_NEXT, 1)]
        if data_out:
            self.mem[b + 0x400:b + 0x400 + len(data_out)] = data_out
            descs.append((b + 0x400, len(data_out), F_NEXT, 2))
        descs.append((b + 0x100, resp_len, F_WRITE | (F_NEXT if data_in else 0), len(descs) + 1))
        if data_in:
            self.mem[b + 0x400:b + 0x400 + data_in] = b'\xee' * data_in
            descs.append((b + 0x400, data_in, F_WRITE, 0))
        descs[-1] = descs[-1][:2] + (descs[-1][2] & ~F_NEXT, 0)
        offer(self.q, descs)
        self.n += 1
        self.q.wait_used(self.n, 'command %02x' % cdb[0])
        sense_len, resid, _, status, response = struct.unpack_from('<IIHBB', self.mem,
                                                                   b + 0x100)
        sense = bytes(self.mem[b + 0x10c:b + 0x10c + sense_len])
        return status, response, sense, bytes(self.mem[b + 0x400:b + 0x400 + data_in])

    def good(self, cdb, what, **kw):
        status, response, sense, data = self.cmd(cdb, **kw)
        if status or response:
            fail('%s: status %d response %d sense %s' % (what, status, response, sense.hex()))
        return data

    def check(self, cdb, key, asc, what, **kw):
        status, response, sense, _ = self.cmd(cdb, **kw)
        if status != 2 or response or len(sense) < 18 or sense[0] != 0x70:
            fail('%s: status %d response %d sense %s, not CHECK CONDITION' %
                 (what, status, response, sense.hex()))
        if sense[2] != key or sense[12] != asc:
            fail('%s: sense key %x asc %02x, not %x/%02x' % (what, sense[2], sense[12], key, asc))


def rw10(op, lba, n):
    return struct.pack('>BBIBHB', op, 0, lba, 0, n, 0)


def report_luns(s):
    data = s.good(struct.pack('>BBBBBBIBB', 0xa0, 0, 0, 0, 0, 0, 512, 0, 0), 'REPORT LUNS',
                  data_in=512)
    n = struct.unpack('>I', data[:4])[0] // 8
    return sorted(((data[8 + 8 * i] & 0x3f) << 8 | data[9 + 8 * i]) for i in range(n))


def test_commands(s, img):
    inq = s.good(bytes([0x12, 0, 0, 0, 96, 0]), 'INQUIRY', data_in=96)
    if inq[0] != 0 or inq[8:16] != b'IOPLANE ':
        fail('INQUIRY: %r' % inq[:36])
    if report_luns(s) != [0, 2]:
        fail('REPORT LUNS: %r, not [0, 2]' % report_luns(s))
    for lun, size in ((0, IMG_SIZE), (2, 8 << 20)):
        cap = s.good(bytes([0x9e, 0x10] + [0] * 11 + [32, 0, 0]), 'READ CAPACITY 16', lun=lun,
                     data_in=32)
        last, bs = struct.unpack('>QI', cap[:12])
        if (last + 1) * bs != size or bs != 512:
            fail('LUN %d: READ CAPACITY says %d blocks of %d' % (lun, last + 1, bs))
    pattern = bytes(range(256)) * 16
    s.good(rw10(0x2a, 8, 8), 'WRITE 10', data_out=pattern)
    if s.good(rw10(0x28, 8, 8), 'READ 10', data_in=4096) != pattern:
        fail('READ 10 did not return what WRITE 10 wrote')
    s.good(bytes([0x35] + [0] * 9), 'SYNCHRONIZE CACHE 10')
    with open(img, 'rb') as f:
        f.seek(8 * 512)
        if f.read(4096) != pattern:
            fail('the image file does not hold the data written')
    # UNMAP blocks 8..11 (two ranges and an empty one), WRITE SAME 16 with UNMAP over
    # 12..15: zeroes.
    plist = struct.pack('>HHI', 54, 48, 0) + struct.pack('>QII', 8, 2, 0) + \
        struct.pack('>QII', 0, 0, 0) + struct.pack('>QII', 10, 2, 0)
    s.good(bytes([0x42, 0, 0, 0, 0, 0, 0, 0, len(plist), 0]), 'UNMAP', data_out=plist)
    ws = struct.pack('>BBQIBB', 0x93, 0x08, 12, 4, 0, 0)
    s.good(ws, 'WRITE SAME 16', data_out=bytes(512))
    if s.good(rw10(0x28, 8, 8), 'READ 10', data_in=4096) != bytes(4096):
        fail('UNMAP and WRITE SAME left data behind')
    s.check(ws, 5, 0x24, 'WRITE SAME 16 of non-zero data', data_out=b'\x01' * 512)
    ms = s.good(bytes([0x1a, 0x08, 0x08, 0, 64, 0]), 'MODE SENSE 6', data_in=64)
    if ms[4] != 0x08 or not ms[6] & 0x04:
        fail('MODE SENSE: no caching page with WCE: %s' % ms[:24].hex())
    s.check(bytes([0xc1] + [0] * 15), 5, 0x20, 'an unknown operation code')
    s.check(rw10(0x28, IMG_SIZE // 512, 1), 5, 0x21, 'READ past the end', data_in=512)
    s.check(bytes(6), 5, 0x25, 'TEST UNIT READY of LUN 7', lun=7)
    status, response, _, _ = s.cmd(bytes(6), target=1)
    if response != 3:
        fail('target 1: response %d, not BAD_TARGET' % response)
    status, response, _, _ = s.cmd(rw10(0x28, 0, 8), data_in=512)
    if response != 1:
        fail('a data-in buffer smaller than the transfer: response %d, not OVERRUN' % response)
    print('commands: ok')


def tmf(ctrl, mem, sub, lun, n):
    b = 0x50000
    req = struct.pack('<II', 0, sub) + bytes([1, 0, 0x40, lun, 0, 0, 0, 0]) + struct.pack('<Q', 1)
    mem[b:b + 24] = req
    mem[b + 0x40] = 0xee
    offer(ctrl, [(b, 24, F_NEXT, 1), (b + 0x40, 1, F_WRITE, 0)])
    ctrl.wait_used(n, 'task management %d' % sub)
    return mem[b + 0x40]


def test_tmf_waits(ctrl, mem, s):
    """A LUN reset while a READ of the slow LUN 3 (null, 300 ms) is in flight answers
    only after the READ completed: the used ring of the control queue gets nothing
    before the request queue has its entry."""
    b = Scsi.BUF
    hdr = bytes([1, 0, 0x40, 3, 0, 0, 0, 0]) + bytes(11) + rw10(0x28, 0, 8).ljust(32, b'\0')
    s.mem[b:b + HDR] = hdr
    offer(s.q, [(b, HDR, F_NEXT, 1), (b + 0x100, RESP, F_WRITE | F_NEXT, 2),
                (b + 0x400, 4096, F_WRITE, 0)])
    s.n += 1
    n = ctrl.used_idx() + 1
    t = 0x50000
    mem[t:t + 24] = struct.pack('<II', 0, 5) + bytes([1, 0, 0x40, 3, 0, 0, 0, 0]) + bytes(8)
    mem[t + 0x40] = 0xee
    offer(ctrl, [(t, 24, F_NEXT, 1), (t + 0x40, 1, F_WRITE, 0)])
    ctrl.wait_used(n, 'LUN reset of LUN 3')
    if s.q.used_idx() < s.n:
        fail('the LUN reset answered while a READ of the LUN was still in flight')
    if mem[t + 0x40] != 0:
        fail('LUN reset with a command in flight: response %d' % mem[t + 0x40])
    print('task management waits for the LUN: ok')


def test_qmp_exports(qmp, tmp):
    """block-export-add of a vhost-user-scsi export with luns over QMP, and what is
    refused."""
    sock = os.path.join(tmp, 'q.sock')
    args = {'type': 'vhost-user-scsi', 'id': 'q0', 'node-name': 'n1', 'writable': True,
            'addr': {'type': 'unix', 'path': sock}, 'num-queues': 1,
            'luns': [{'lun': 4, 'node-name': 'n2'}]}
    r = qmp.cmd('block-export-add', args)
    if r != {'return': {}}:
        fail('block-export-add vhost-user-scsi: %r' % r)
    for bad, what in (({'id': 'q0', 'lun': 300, 'node-name': 'n3'}, 'LUN 300'),
                      ({'id': 'q0', 'lun': 4, 'node-name': 'n3'}, 'a LUN in use'),
                      ({'id': 'q0', 'lun': 5, 'node-name': 'n2'}, 'a node that is a LUN'),
                      ({'id': 'q0', 'lun': 5, 'node-name': 'nope'}, 'a missing node'),
                      ({'id': 'q0', 'lun': 5, 'node-name': 'ro'}, 'a read-only node'),
                      ({'id': 's9', 'lun': 5, 'node-name': 'n3'}, 'a missing export')):
        r = qmp.cmd('x-vhost-user-scsi-lun-add', bad)
        if 'error' not in r:
            fail('lun-add of %s was accepted' % what)
    r = qmp.cmd('x-vhost-user-scsi-lun-remove', {'id': 'q0', 'lun': 4})
    if r != {'return': {}}:
        fail('lun-remove on the QMP export: %r' % r)
    r = qmp.cmd('block-export-del', {'id': 'q0'})
    if r != {'return': {}}:
        fail('block-export-del: %r' % r)
    if qmp.wait_event('BLOCK_EXPORT_DELETED', {'id': 'q0'}) is None:
        fail('no BLOCK_EXPORT_DELETED for q0')
    print('QMP: ok')


def test_tmf(ctrl, mem):
    for n, (sub, lun, want) in enumerate(((5, 0, 0), (0, 0, 0), (4, 0, 0), (2, 0, 11),
                                          (5, 9, 12)), 1):
        got = tmf(ctrl, mem, sub, lun, n)
        if got != want:
            fail('task management function %d on LUN %d: response %d, not %d' %
                 (sub, lun, got, want))
    print('task management: ok')


def wait_event(evq, mem, n, want_lun, reason):
    evq.wait_used(n, 'event %d' % n)
    b = 0x60000 + 0x100 * ((n - 1) % 4)
    event, lun, got = struct.unpack_from('<I8sI', mem, b)
    if event != 1 or lun[:4] != bytes([1, 0, 0x40, want_lun]) or got != reason:
        fail('event %d: %d %s %d, not a transport reset of LUN %d reason %d' %
             (n, event, lun.hex(), got, want_lun, reason))


def test_hotplug(qmp, s, evq, mem):
    for i in range(4):
        evq.offer([(0x60000 + 0x100 * i, 16, F_WRITE, 0)])
    r = qmp.cmd('x-vhost-user-scsi-lun-add', {'id': 's0', 'lun': 5, 'node-name': 'n2'})
    if r != {'return': {}}:
        fail('lun-add: %r' % r)
    wait_event(evq, mem, 1, 5, 1)
    if report_luns(s) != [0, 2, 5]:
        fail('after lun-add, REPORT LUNS: %r' % report_luns(s))
    r = qmp.cmd('x-vhost-user-scsi-lun-add', {'id': 's0', 'lun': 5, 'node-name': 'n2'})
    if 'error' not in r:
        fail('a second lun-add of LUN 5 was accepted')
    r = qmp.cmd('x-vhost-user-scsi-lun-remove', {'id': 's0', 'lun': 5})
    if r != {'return': {}}:
        fail('lun-remove: %r' % r)
    wait_event(evq, mem, 2, 5, 2)
    if report_luns(s) != [0, 2]:
        fail('after lun-remove, REPORT LUNS: %r' % report_luns(s))
    s.check(bytes(6), 5, 0x25, 'TEST UNIT READY of the removed LUN', lun=5)
    r = qmp.cmd('x-vhost-user-scsi-lun-remove', {'id': 's0', 'lun': 5})
    if 'error' not in r:
        fail('removing LUN 5 twice was accepted')
    print('hot-plug: ok')


def test_reset(fe, mem, s):
    """As QEMU's vhost-user-scsi resets the device (the guest's driver took over from the
    firmware's): RESET_DEVICE, then features and rings again but not the memory table,
    which the front-end does not send twice. The rings must run on it."""
    if fe.ack(RESET_DEVICE):
        fail('RESET_DEVICE refused')
    if fe.ack(SET_FEATURES, struct.pack('<Q', _vhostfe.FEATURES | HOTPLUG)):
        fail('SET_FEATURES after RESET_DEVICE refused')
    q = Queue(fe, mem, 2, 0x30000)
    s.q, s.n = q, 0
    s.good(bytes(6), 'TEST UNIT READY after RESET_DEVICE')
    print('reset: ok')
    return q


def test_broken(q3, s):
    # A response that cannot hold the sense bytes: no way to answer, the queue stops.
    s.q = q3
    s.n = 0
    hdr = bytes([1, 0, 0x40, 0] + [0] * 15) + bytes(32)
    s.mem[s.BUF:s.BUF + HDR] = hdr
    offer(q3, [(s.BUF, HDR, F_NEXT, 1), (s.BUF + 0x100, 8, F_WRITE, 0)])
    wait_fd(q3.err, 'the error eventfd of the queue with a short response')
    print('broken chain: ok')


def run(tmp):
    img = os.path.join(tmp, 'a.raw')
    with open(img, 'wb') as f:
        f.truncate(IMG_SIZE)
    sock = os.path.join(tmp, 's.sock')
    d = Daemon('ioplane', tmp, [
        '--blockdev', 'driver=file,filename=%s,node-name=n0' % img,
        '--blockdev', 'driver=null-co,node-name=n1,size=%d' % (8 << 20),
        '--blockdev', 'driver=null-co,node-name=n2,size=%d' % (16 << 20),
        '--blockdev', 'driver=null-co,node-name=n3,size=%d,latency-ns=300000000' % (1 << 20),
        '--blockdev', 'driver=null-co,node-name=ro,size=%d,read-only=on' % (1 << 20),
        '--export', 'type=vhost-user-scsi,id=s0,node-name=n0,writable=on,num-queues=2,'
        'addr.type=unix,addr.path=%s,luns.0.lun=2,luns.0.node-name=n1' % sock])
    ok = False
    try:
        _vhostfe.wait_socket(sock, d.proc)
        qmp = d.client().negotiate()
        memfd, mem = guest_memory()
        fe = FrontEnd(sock)
        handshake(fe, memfd)
        ctrl = Queue(fe, mem, 0, 0x10000)
        evq = Queue(fe, mem, 1, 0x18000)
        req = Queue(fe, mem, 2, 0x20000)
        q3 = Queue(fe, mem, 3, 0x28000)
        s = Scsi(req, mem)
        test_commands(s, img)
        test_tmf(ctrl, mem)
        test_hotplug(qmp, s, evq, mem)
        r = qmp.cmd('x-vhost-user-scsi-lun-add', {'id': 's0', 'lun': 3, 'node-name': 'n3'})
        if r != {'return': {}}:
            fail('lun-add of the slow LUN: %r' % r)
        test_tmf_waits(ctrl, mem, s)
        test_qmp_exports(qmp, tmp)
        test_broken(q3, s)
        if readable(req.err):
            fail('the other request queue stopped too')
        test_reset(fe, mem, s)
        fe.close()
        if bench('--vhost-user', sock, '--scsi', '--num-queues', '2', '-c', '2000', '-d', '16',
                 '-w', '--verify', '-q') != 0:
            fail('ioplane bench --scsi -w --verify failed')
        if bench('--vhost-user', sock, '--scsi', '-c', '2000', '-d', '16', '--verify',
                 '-q') != 0:
            fail('ioplane bench --scsi --verify (read) failed')
        print('bench --scsi: ok')
        r = qmp.cmd('quit')
        if d.wait() != 0:
            fail('ioplane serve did not exit 0 after quit')
        ok = True
    finally:
        d.cleanup(ok)


def main():
    tmp = tempfile.mkdtemp(prefix='ioplane-vscsi-')
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print('PASS')


if __name__ == '__main__':
    main()
