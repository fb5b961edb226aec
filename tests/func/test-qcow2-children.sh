#!/bin/bash
# A qcow2 image with a backing file and an external data file, served by `ioplane serve`
# over 4 iothreads with aio=native and aio=io_uring (cache=none where O_DIRECT works):
# 4 clients at once read through to the backing file, write new clusters (into the data
# file) and partial clusters (copy-on-write reads from the backing file). Then SIGTERM:
# exit 0, which in the sanitizer build also means no use of per-iothread engine state of
# the backing or data-file nodes after their iothread is gone; qemu-img check is clean
# and every byte reads back as written, through qemu-io.
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
nbd_need qemu-img qemu-io

sock=$NBD_TMP/nbd.sock
K=1024 M=1048576
cache=writeback
have_odirect && cache=none

# One client: reads of the backing pattern, then writes of its own pattern into whole and
# half clusters of its quarter of the image (64 KiB clusters), read back.
client() {
	local uri=$1 k=$2 base=$(($2 * 8)) pat=$((0x40 + $2))
	nbd_qemu_io "$uri" \
		"read -P 0x5b ${base}M 1M" \
		"write -P $pat $((base + 1))M 256k" \
		"write -P $pat $((base + 2))M 32k" \
		"write -P $pat $((base + 3))M 1k" \
		"read -P 0x5b $(((base + 2) * M + 32 * K)) 32k" \
		"read -P $pat $((base + 1))M 256k" \
		"read -P 0x5b $((base + 4))M 2M" >"$NBD_TMP/client-$k.log"
}

for aio in native io_uring; do
	rm -f "$NBD_TMP"/base.qcow2 "$NBD_TMP"/top.qcow2 "$NBD_TMP"/data.raw
	qemu-img create -q -f qcow2 "$NBD_TMP/base.qcow2" 32M
	qemu-io -f qcow2 "$NBD_TMP/base.qcow2" -c 'write -P 0x5b 0 32M' >/dev/null
	qemu-img create -q -f qcow2 -o data_file="$NBD_TMP/data.raw" \
		-b "$NBD_TMP/base.qcow2" -F qcow2 "$NBD_TMP/top.qcow2" 32M
	nbd_serve --iothreads 4 \
		--image t,file="$NBD_TMP/top.qcow2",format=qcow2,aio=$aio,cache=$cache \
		--nbd unix="$sock",image=t,writable=on
	pids=()
	for k in 0 1 2 3; do
		client "$(nbd_uri t "$sock")" $k &
		pids+=($!)
	done
	for p in "${pids[@]}"; do
		wait "$p" || fail "aio=$aio: a client failed: $(cat "$NBD_TMP"/client-*.log)"
	done
	nbd_stop
	qemu-img check -q "$NBD_TMP/top.qcow2" || fail "aio=$aio: qemu-img check"
	qemu-img check -q "$NBD_TMP/base.qcow2" || fail "aio=$aio: backing file check"
	for k in 0 1 2 3; do
		base=$((k * 8)) pat=$((0x40 + k))
		out=$(qemu-io -r -f qcow2 "$NBD_TMP/top.qcow2" \
			-c "read -P 0x5b ${base}M 1M" -c "read -P $pat $((base + 1))M 256k" \
			-c "read -P 0x5b $(((base + 1) * M + 256 * K)) 768k" \
			-c "read -P $pat $((base + 2))M 32k" \
			-c "read -P 0x5b $(((base + 2) * M + 32 * K)) 992k" \
			-c "read -P $pat $((base + 3))M 1k" \
			-c "read -P 0x5b $(((base + 3) * M + K)) 5119k" \
			2>&1)
		if grep -qiE 'fail|error|mismatch' <<<"$out"; then
			fail "aio=$aio: contents of quarter $k: $out"
		fi
	done
	# The backing file is never written.
	out=$(qemu-io -r -f qcow2 "$NBD_TMP/base.qcow2" -c 'read -P 0x5b 0 32M' 2>&1)
	grep -qiE 'fail|error|mismatch' <<<"$out" && fail "aio=$aio: backing file changed: $out"
	echo "aio=$aio: ok"
done
echo PASS
