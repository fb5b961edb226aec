#!/usr/bin/env python3
"""The host side of a hot-plug run of run-vm-test.sh (--hotplug): once the guest waits
for its disk, add the vhost-user-blk export over ioplane's QMP monitor
($VMTEST_SOCK.qmp), then plug the device into the running QEMU through QEMU's own
monitor (chardev-add + device_add vhost-user-blk-pci); with a size argument, resize
the node (block_resize) when the guest waits for that; with --snapshot FILE, take a
live external snapshot of the node into FILE (blockdev-snapshot-sync) once the guest
has written and verified its serial pattern, so that its parallel writes and every
later read go through the overlay; with --mirror FILE, mirror the node into a raw FILE
of its size at that point (blockdev-mirror, READY, job-complete), so that the export
switches to the copy under the guest's parallel writes. Every wait is bounded.
Usage: vm-hotplug.py NODE [RESIZE_BYTES] | vm-hotplug.py NODE --snapshot|--mirror FILE"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmhost import Client, fail, ok, wait_console  # noqa: E402


def main():
    node = sys.argv[1]
    snap = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == '--snapshot' else None
    mirror = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == '--mirror' else None
    resize = int(sys.argv[2]) if len(sys.argv) > 2 and not snap and not mirror else 0
    sock, nq = os.environ['VMTEST_SOCK'], int(os.environ.get('VMTEST_NUM_QUEUES', '1'))
    wait_console('VMTEST: waiting for the disk', 900)
    io = Client(sock + '.qmp').negotiate()
    ok(io, 'block-export-add', {'type': 'vhost-user-blk', 'id': 'hp', 'node-name': node,
                                'writable': True, 'num-queues': nq,
                                'addr': {'type': 'unix', 'path': sock}})
    qemu = Client(os.environ['VMTEST_QEMU_QMP']).negotiate()
    ok(qemu, 'chardev-add', {'id': 'vu0', 'backend': {'type': 'socket', 'data': {
        'addr': {'type': 'unix', 'data': {'path': sock}}, 'server': False}}})
    ok(qemu, 'device_add', {'driver': 'vhost-user-blk-pci', 'id': 'hpdisk', 'chardev': 'vu0',
                            'num-queues': nq})
    if snap:
        wait_console('VMTEST: serial_rw=ok', 900)
        ok(io, 'blockdev-snapshot-sync', {'node-name': node, 'snapshot-file': snap,
                                          'snapshot-node-name': node + '-snap'})
        node += '-snap'
        exports = ok(io, 'query-block-exports')
        if [e['node-name'] for e in exports] != [node]:
            fail('the export does not serve the overlay: %r' % exports)
    if mirror:
        wait_console('VMTEST: serial_rw=ok', 900)
        node = mirror_switch(io, node, mirror)
    if resize:
        wait_console('VMTEST: waiting for resize', 900)
        ok(io, 'block_resize', {'node-name': node, 'size': resize})
    ids = [e['id'] for e in ok(io, 'query-block-exports')]
    if 'hp' not in ids:
        fail('query-block-exports: %r' % ids)


def mirror_switch(io, node, path):
    """Mirror node into a new raw file under the guest's writes and switch to it."""
    with open(path, 'wb') as f:
        f.truncate(os.path.getsize(os.environ['VMTEST_IMG']))
    ok(io, 'blockdev-add', {'driver': 'file', 'node-name': 'mtf', 'filename': path})
    ok(io, 'blockdev-add', {'driver': 'raw', 'node-name': 'mt', 'file': 'mtf'})
    ok(io, 'blockdev-mirror', {'job-id': 'm', 'device': node, 'target': 'mt',
                               'sync': 'full'})
    if not io.wait_event('BLOCK_JOB_READY', timeout=300):
        fail('the mirror never became ready: %r' % ok(io, 'query-jobs'))
    ok(io, 'job-complete', {'id': 'm'})
    e = io.wait_event('BLOCK_JOB_COMPLETED', timeout=300)
    if not e or 'error' in e['data']:
        fail('the mirror did not complete: %r' % e)
    for _ in range(100):  # the job is gone once it is dismissed
        if not ok(io, 'query-jobs'):
            break
        time.sleep(0.1)
    exports = ok(io, 'query-block-exports')
    if [e['node-name'] for e in exports] != ['mt']:
        fail('the export does not serve the mirror target: %r' % exports)
    print('VMHOST: mirror switched the export to %s' % path, flush=True)
    return 'mt'


if __name__ == '__main__':
    main()
