#!/bin/bash
# A real Linux guest (tests/vm/run-vm-test.sh's recipe, QEMU TCG) on an RBD-backed
# vhost-user-blk disk: the host's image goes into the test cluster (rbd import),
# `ioplane serve` exports rbd:rbd/vm over vhost-user-blk with 2 queues, the guest
# checks, writes, reads back and verifies patterns from every vCPU, flushes and
# discards; the host then reads the image back out of the cluster (rbd export) and
# checks it holds what the guest says it wrote. Skips (77) without the VM's tools or
# its kernel package, as test-vhost-vm.sh does.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/lib-ceph.sh"

nbd_need_ioplane
ceph_need
for c in qemu-system-x86_64 busybox cpio dpkg-deb apt-get sha256sum; do
	command -v "$c" >/dev/null 2>&1 || skip "$c is not installed"
done
ldd "$(command -v busybox)" >/dev/null 2>&1 && skip "busybox is not static (install busybox-static)"
vm=$IOPLANE_SRC/tests/vm
workdir=${IOPLANE_VM_WORKDIR:-/var/tmp/ioplane-vmtest}
mkdir -p "$workdir" || skip "cannot create $workdir"
ceph_start

T=$NBD_TMP
log=$T/vm.log
serve="$IOPLANE serve --iothreads 2 --image d,file=rbd:rbd/vm,format=raw,cache=none"
serve="$serve --vhost-user-blk unix=\"\$VMTEST_SOCK\",image=d,num-queues=2,writable=on,serial=ioplane-vm"
rc=0
bash "$vm/run-vm-test.sh" --perf-mb 0 --perf4k-mb 0 --discard-zero --flush-required \
	--workdir "$workdir" --timeout 600 --num-queues 2 --disk-mb 256 --no-image-checks \
	--server-cmd "timeout 120 rbd import --no-progress \"\$VMTEST_IMG\" rbd/vm && exec $serve" \
	>"$log" 2>&1 || rc=$?
sed -n '/run-vm-test summary/,$p' "$log"
if [ $rc -eq 2 ] && ! grep -q 'VMTEST:' "$log"; then
	tail -n 5 "$log"
	skip "the VM could not be set up (kernel download?)"
fi
[ $rc -eq 0 ] || { tail -n 60 "$log"; fail "the guest on rbd:rbd/vm failed (exit $rc)"; }

want=$(sed -n 's/.*VMTEST: pattern_sha256=\([0-9a-f]*\).*/\1/p' "$log" | head -n 1)
mb=$(sed -n 's/.*VMTEST: pattern_sha256=[0-9a-f]* pattern_mb=\([0-9]*\).*/\1/p' "$log" | head -n 1)
[ -n "$want" ] && [ -n "$mb" ] || fail "the guest reported no pattern checksum"
timeout 120 rbd export --no-progress rbd/vm "$T/out.raw" >/dev/null || fail "rbd export"
got=$(head -c $((mb * 1048576)) "$T/out.raw" | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "the RBD image does not hold the guest's data"
echo "the RBD image holds the guest's data: ok"
