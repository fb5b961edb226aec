#!/usr/bin/env python3
"""The host side of a hot-plug run of run-vm-test.sh (--hotplug): once the guest waits
for its disk, add the vhost-user-blk export over ioplane's QMP monitor
($VMTEST_SOCK.qmp), then plug the device into the running QEMU through QEMU's own
monitor (chardev-add + device_add vhost-user-blk-pci); with a size argument, resize
the node (block_resize) when the guest waits for that; with --snapshot FILE, take a
live external snapshot of the node into FILE (blockdev-snapshot-sync) once the guest
has written and verified its serial pattern, so that its parallel writes and every
later read go through the overlay. Every wait is bounded.
Usage: vm-hotplug.py NODE [RESIZE_BYTES] | vm-hotplug.py NODE --snapshot FILE"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmhost import Client, fail, ok, wait_console  # noqa: E402


def main():
    node = sys.argv[1]
    snap = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == '--snapshot' else None
    resize = int(sys.argv[2]) if len(sys.argv) > 2 and not snap else 0
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
    if resize:
        wait_console('VMTEST: waiting for resize', 900)
        ok(io, 'block_resize', {'node-name': node, 'size': resize})
    ids = [e['id'] for e in ok(io, 'query-block-exports')]
    if 'hp' not in ids:
        fail('query-block-exports: %r' % ids)


if __name__ == '__main__':
    main()
