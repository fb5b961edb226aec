#!/bin/bash
# A real Linux guest (Debian cloud kernel, busybox initramfs) under QEMU TCG attaches
# `ioplane serve` over vhost-user-blk-pci with 1, 2 and 4 queues (raw file), and once
# with a qcow2 image. The guest checks a host-seeded region, writes, reads back and
# verifies patterns serially and from every vCPU (so every queue is used), FLUSH must
# be sent, and a DISCARD must succeed and read back as zeroes; the host then checks the
# image holds what the guest wrote. Once more with the disk hot-plugged into the running
# guest (export over ioplane's QMP, QEMU's device_add) and resized under it, and once
# live-migrated to a second QEMU (on a second export of the same disk) while it writes,
# once on packed virtqueues, and with a live external snapshot taken while the guest
# writes and verifies, and with a mirror that switches the export to a copy under the
# guest's writes. Once more through vhost-user-scsi-pci: the guest's sd driver sees
# LUN 0 (every check above) and LUN 1, writes and verifies both, and a LUN hot-added
# over ioplane's QMP (x-vhost-user-scsi-lun-add) appears in it and verifies too.
# Recipe: tests/vm/run-vm-test.sh.
#
# Needs qemu-system-x86_64, busybox-static, cpio, dpkg-deb and apt-get (the kernel .deb
# is fetched once from Debian's archive with `apt-get download` and cached in
# $IOPLANE_VM_WORKDIR, default /var/tmp/ioplane-vmtest). Skips (77) when any is missing.
# IOPLANE_VM_QUEUES="1 2 4" picks the runs; IOPLANE_VM_QCOW2=0 skips the qcow2 run,
# IOPLANE_VM_MIGRATE=0 the migration, IOPLANE_VM_PACKED=0 the packed-ring run,
# IOPLANE_VM_SNAPSHOT=0 the live-snapshot run, IOPLANE_VM_MIRROR=0 the mirror run,
# IOPLANE_VM_SCSI=0 the vhost-user-scsi run.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${IOPLANE_SRC:-$(cd "$here/../.." && pwd)}
IOPLANE=${IOPLANE:-${IOPLANE_BUILD:-$src/build}/ioplane}
workdir=${IOPLANE_VM_WORKDIR:-/var/tmp/ioplane-vmtest}
queues=${IOPLANE_VM_QUEUES:-1 2 4}

skip() {
	echo "SKIP: $*"
	exit 77
}

[ -x "$IOPLANE" ] || skip "no ioplane binary at $IOPLANE"
for c in qemu-system-x86_64 busybox cpio dpkg-deb apt-get qemu-img sha256sum; do
	command -v "$c" >/dev/null 2>&1 || skip "$c is not installed"
done
ldd "$(command -v busybox)" >/dev/null 2>&1 && skip "busybox is not static (install busybox-static)"
mkdir -p "$workdir" || skip "cannot create $workdir"
tmp=$(mktemp -d "$workdir/t.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

serve="$IOPLANE serve --iothreads 2"
vhost_opts='unix="$VMTEST_SOCK",image=d,num-queues=$VMTEST_NUM_QUEUES,writable=on,serial=ioplane-vm'
common=(--perf-mb 0 --perf4k-mb 0 --discard-zero --flush-required --workdir "$workdir"
	--timeout 600)

# run NAME ARGS...: one guest; exit 2 from the recipe is a setup problem (no kernel).
run() {
	local name=$1 rc=0
	shift
	echo "== $name"
	bash "$here/run-vm-test.sh" "${common[@]}" "$@" >"$tmp/$name.log" 2>&1 || rc=$?
	sed -n '/run-vm-test summary/,$p' "$tmp/$name.log"
	if [ $rc -eq 2 ] && ! grep -q 'VMTEST:' "$tmp/$name.log"; then
		tail -n 5 "$tmp/$name.log"
		skip "the VM could not be set up (kernel download?)"
	fi
	if [ $rc -ne 0 ]; then
		tail -n 60 "$tmp/$name.log"
		echo "FAIL: $name (exit $rc)"
		exit 1
	fi
}

# Hot-plug: the guest boots without a disk; the export is added over ioplane's QMP and
# plugged into the running QEMU with its device_add; the guest sees it, runs every
# check, and - when this ioplane has block_resize - sees the disk grow by 64 MiB.
if [ "${IOPLANE_VM_HOTPLUG:-1}" = 1 ]; then
	resize=
	$IOPLANE serve -q --monitor unix="$tmp/probe.qmp" &
	probe=$!
	for _ in $(seq 100); do [ -S "$tmp/probe.qmp" ] && break; sleep 0.1; done
	timeout 10 $IOPLANE qmp "$tmp/probe.qmp" query-commands 2>/dev/null |
		grep -q '"block_resize"' && resize=320
	kill "$probe"; wait "$probe" 2>/dev/null
	run hotplug --num-queues 2 --disk-mb 256 ${resize:+--resize-mb $resize} \
		--server-cmd "exec $serve --image d,file=\"\$VMTEST_IMG\" --monitor unix=\"\$VMTEST_SOCK.qmp\"" \
		--hotplug "exec python3 $here/vm-hotplug.py d ${resize:+$((resize * 1048576))}"
	grep -q 'resize=ok' "$tmp/hotplug.log" && echo "the guest saw the resize: ok"
	[ -n "$resize" ] || echo "(block_resize not available in this ioplane: no resize run)"
fi

# Live migration: the same disk exported on a second socket for the destination QEMU;
# the guest writes and verifies from both vCPUs (and fio at depth 32 keeps requests in
# flight) while QEMU migrates it, and goes on without an error on the destination.
if [ "${IOPLANE_VM_MIGRATE:-1}" = 1 ]; then
	fio=
	command -v fio >/dev/null 2>&1 && fio=--fio
	mig_opts='image=d,num-queues=2,writable=on,serial=ioplane-vm'
	run migrate --num-queues 2 --migrate $fio --fio-runtime 2 \
		--server-cmd "exec $serve --image d,file=\"\$VMTEST_IMG\",format=raw --vhost-user-blk unix=\"\$VMTEST_SOCK\",$mig_opts --vhost-user-blk unix=\"\$VMTEST_SOCK2\",$mig_opts"
	grep -q 'migrate_rw=ok' "$tmp/migrate.log" || { echo "FAIL: no migrate_rw=ok"; exit 1; }
	grep 'migration: completed' "$tmp/migrate.log"
fi

# vhost-user-scsi: LUN 0 the test disk, LUN 1 from luns=[...], LUN 2 hot-added.
if [ "${IOPLANE_VM_SCSI:-1}" = 1 ]; then
	scsi_nodes="--blockdev driver=file,node-name=d,filename=\"\$VMTEST_IMG\" --blockdev driver=file,node-name=l1,filename=$tmp/lun1.raw --blockdev driver=file,node-name=l2,filename=$tmp/lun2.raw"
	scsi_export='type=vhost-user-scsi,id=s0,node-name=d,writable=on,num-queues=$VMTEST_NUM_QUEUES,addr.type=unix,addr.path="$VMTEST_SOCK",luns.0.lun=1,luns.0.node-name=l1'
	run scsi --scsi --num-queues 2 --scsi-luns 2 \
		--lun-cmd "exec python3 $here/vm-scsi-lun.py s0 2 l2" \
		--server-cmd "truncate -s 64M $tmp/lun1.raw $tmp/lun2.raw && exec $serve $scsi_nodes --monitor unix=\"\$VMTEST_SOCK.qmp\" --export $scsi_export"
	grep -q 'scsi_luns=ok' "$tmp/scsi.log" && grep -q 'hotlun=ok' "$tmp/scsi.log" ||
		{ echo "FAIL: the guest did not see every LUN"; exit 1; }
fi

for nq in $queues; do
	run "raw-$nq-queues" --num-queues "$nq" \
		--server-cmd "exec $serve --image d,file=\"\$VMTEST_IMG\" --vhost-user-blk $vhost_opts"
done

# Packed virtqueues: the guest's virtio-blk driver on VIRTIO_F_RING_PACKED rings
# (with EVENT_IDX and indirect descriptors), 2 queues, every check as above.
if [ "${IOPLANE_VM_PACKED:-1}" = 1 ]; then
	run packed --num-queues 2 --device-opts packed=on \
		--server-cmd "exec $serve --image d,file=\"\$VMTEST_IMG\" --vhost-user-blk $vhost_opts"
	grep -q 'virtio_features=.*RING_PACKED' "$tmp/packed.log" ||
		{ echo "FAIL: the guest did not negotiate packed rings"; exit 1; }
fi

# same_pattern RUN RAW: the first pattern_mb MiB of RAW hash to the pattern_sha256 the
# guest of RUN printed.
same_pattern() {
	local want mb
	want=$(sed -n 's/.*VMTEST: pattern_sha256=\([0-9a-f]*\).*/\1/p' "$tmp/$1.log" | head -n 1)
	mb=$(sed -n 's/.*VMTEST: pattern_sha256=[0-9a-f]* pattern_mb=\([0-9]*\).*/\1/p' \
		"$tmp/$1.log" | head -n 1)
	[ -n "$want" ] && [ -n "$mb" ] &&
		[ "$(head -c $((mb * 1048576)) "$2" | sha256sum | cut -d' ' -f1)" = "$want" ]
}

# A live external snapshot: the guest's qcow2 disk is hot-plugged, and once it has
# written and verified its serial pattern the node is snapshotted into an overlay; the
# guest goes on writing and verifying (parallel pattern, discard) through it. After
# shutdown both images pass qemu-img check and the chain holds what the guest wrote.
if [ "${IOPLANE_VM_SNAPSHOT:-1}" = 1 ]; then
	q=$tmp/snap-base.qcow2 o=$tmp/snap-top.qcow2
	run snapshot --num-queues 2 --disk-mb 256 --no-image-checks \
		--server-cmd "qemu-img convert -f raw -O qcow2 \"\$VMTEST_IMG\" $q && exec $serve --image d,file=$q,format=qcow2 --monitor unix=\"\$VMTEST_SOCK.qmp\"" \
		--hotplug "exec python3 $here/vm-hotplug.py d --snapshot $o"
	[ -f "$o" ] || { echo "FAIL: no snapshot taken"; exit 1; }
	for img in "$q" "$o"; do
		qemu-img check "$img" >"$tmp/check.log" 2>&1 || { cat "$tmp/check.log"; echo "FAIL: qemu-img check $img"; exit 1; }
	done
	[ "$(qemu-img info --output=json "$o" | python3 -c 'import json,sys; print(json.load(sys.stdin)["backing-filename"])')" = "$q" ] ||
		{ echo "FAIL: the overlay does not name the old image as its backing file"; exit 1; }
	# The guest's writes after the snapshot are in the overlay.
	qemu-img map --output=json "$o" | python3 -c 'import json, sys
sys.exit(0 if any(e["depth"] == 0 and e["data"] for e in json.load(sys.stdin)) else 1)' ||
		{ echo "FAIL: the overlay holds no data: the guest wrote nothing after the snapshot"; exit 1; }
	qemu-img convert -f qcow2 -O raw "$o" "$tmp/snap.raw"
	same_pattern snapshot "$tmp/snap.raw" || { echo "FAIL: the snapshot chain differs from the guest's data"; exit 1; }
	echo "live snapshot: the chain holds the guest's data: ok"
fi

# A mirror to a new raw file while the guest writes and verifies: once the guest has
# verified its serial pattern, blockdev-mirror copies the disk, and job-complete
# switches the vhost-user-blk export to the copy under the guest's parallel writes,
# reads and discard. The copy then holds the guest's serial pattern.
if [ "${IOPLANE_VM_MIRROR:-1}" = 1 ]; then
	m=$tmp/mirror.raw
	run mirror --num-queues 2 --disk-mb 256 --no-image-checks \
		--server-cmd "exec $serve --image d,file=\"\$VMTEST_IMG\",format=raw --monitor unix=\"\$VMTEST_SOCK.qmp\"" \
		--hotplug "exec python3 $here/vm-hotplug.py d --mirror $m"
	[ -f "$m" ] || { echo "FAIL: no mirror target"; exit 1; }
	same_pattern mirror "$m" || { echo "FAIL: the mirror target differs from the guest's data"; exit 1; }
	echo "live mirror: the export switched and the copy holds the guest's data: ok"
fi

if [ "${IOPLANE_VM_QCOW2:-1}" = 1 ]; then
	q=$tmp/disk.qcow2
	# The guest's own checks (seed, readback, discard) cover the qcow2 run; the host
	# then compares the image's data with what the guest says it wrote.
	run qcow2 --num-queues 2 --no-image-checks \
		--server-cmd "qemu-img convert -f raw -O qcow2 \"\$VMTEST_IMG\" $q && exec $serve --image d,file=$q,format=qcow2 --vhost-user-blk $vhost_opts"
	want=$(sed -n 's/.*VMTEST: pattern_sha256=\([0-9a-f]*\).*/\1/p' "$tmp/qcow2.log" | head -n 1)
	mb=$(sed -n 's/.*VMTEST: pattern_sha256=[0-9a-f]* pattern_mb=\([0-9]*\).*/\1/p' \
		"$tmp/qcow2.log" | head -n 1)
	qemu-img check "$q" >"$tmp/check.log" 2>&1 || { cat "$tmp/check.log"; echo "FAIL: qemu-img check"; exit 1; }
	qemu-img convert -f qcow2 -O raw "$q" "$tmp/out.raw"
	got=$(head -c $((mb * 1048576)) "$tmp/out.raw" | sha256sum | cut -d' ' -f1)
	[ -n "$want" ] && [ "$got" = "$want" ] || { echo "FAIL: qcow2 image data differs from the guest's"; exit 1; }
	echo "qcow2 image holds the guest's data: ok"
fi
echo "PASS"
