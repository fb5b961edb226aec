#!/usr/bin/env python3
"""The host side of a --lun-cmd run of run-vm-test.sh: once the guest waits for a new
LUN, hot-add NODE as LUN N of the vhost-user-scsi export ID over ioplane's QMP monitor
($VMTEST_SOCK.qmp) with x-vhost-user-scsi-lun-add; the guest's virtio-scsi driver gets
the transport reset event and scans it. Every wait is bounded.
Usage: vm-scsi-lun.py ID LUN NODE"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vmhost import Client, fail, ok, wait_console  # noqa: E402


def main():
    exp, lun, node = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    io = Client(os.environ['VMTEST_SOCK'] + '.qmp').negotiate()
    wait_console('VMTEST: waiting for a new LUN', 900)
    ok(io, 'x-vhost-user-scsi-lun-add', {'id': exp, 'lun': lun, 'node-name': node})
    wait_console('VMTEST: hotlun=ok', 300)
    if [e['id'] for e in ok(io, 'query-block-exports')] != [exp]:
        fail('query-block-exports does not list %s' % exp)


if __name__ == '__main__':
    main()
