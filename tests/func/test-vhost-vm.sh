#!/bin/bash
# Runs the real-guest vhost-user-blk test (tests/vm/test-vm-vhost.sh: a Linux guest
# under QEMU TCG with 1, 2, 4 queues and a qcow2 image, data verified end to end).
# Skips with the reason when qemu-system-x86_64, busybox-static, cpio or the kernel
# package is not available. In the sanitizer build (slower) one raw run with 2 queues
# and the qcow2 run are enough.
case "${IOPLANE_BUILD:-}" in
*-asan) export IOPLANE_VM_QUEUES=${IOPLANE_VM_QUEUES:-2} ;;
esac
exec bash "$(dirname "${BASH_SOURCE[0]}")/../vm/test-vm-vhost.sh" "$@"
