#!/bin/bash
# qcow2 images made by `ioplane img create` (with each kind of create option) and written
# through `ioplane serve` by qemu-io over NBD with random workloads (pattern writes aligned
# and not, write-zeroes with and without unmap, cluster-aligned discards, batches of aio
# writes, flushes): after the daemon exits, qemu-img check finds no error and no leak, and
# qemu-img compare finds the content the same workload gives a raw file. Then ioplane
# itself reads the image back (convert) the same, and `ioplane img check` agrees.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/img-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "NBD_TEST_PEER: this test is about ioplane's qcow2 driver"

WORK=$IMG_LIB_DIR/_imgwork.py
SIZE=$((16 << 20))
sock=$T/nbd.sock
n=0

# run_workload URI RAW SEED CLUSTER [_imgwork options]: same commands over NBD and on RAW.
run_workload() {
	local uri=$1 raw=$2 seed=$3 cs=$4 c
	shift 4
	local -a args=()
	mapfile -t cmds < <(python3 "$WORK" qemu-io "$seed" "$SIZE" "$cs" --count 120 "$@")
	for c in "${cmds[@]}"; do
		args+=(-c "$c")
	done
	nbd_qemu_io "$uri" "${cmds[@]}" >qio.log || { grep -v "^wrote\|ops;" qio.log >&2; false; }
	qemu-io -f raw "${args[@]}" "$raw" >/dev/null
}

# serve_case OPTIONS CLUSTER [SERVE-OPTIONS] [-- _imgwork options]
serve_case() {
	local opts=$1 cs=$2 sopts=${3:-} seed
	shift 3 || shift $#
	n=$((n + 1))
	echo "== -o $opts ${sopts:+(serve: $sopts)}"
	rm -f s.qcow2 s.raw s.data
	img create -q -f qcow2 -o "$opts" s.qcow2 "$SIZE"
	truncate -s "$SIZE" s.raw
	nbd_serve --image "d,file=s.qcow2,format=qcow2$sopts" --nbd unix="$sock",image=d,writable=on
	for seed in 1 2 3; do
		run_workload "$(nbd_uri d "$sock")" s.raw $((n * 100 + seed)) "$cs" "$@"
	done
	nbd_stop
	qcheck s.qcow2
	qemu-img compare -q -f raw -F qcow2 s.raw s.qcow2 || fail "-o $opts: content differs"
	ioplane_raw s.qcow2 s.back.raw
	cmp s.raw s.back.raw || fail "-o $opts: ioplane reads back other bytes"
	img check s.qcow2
	expect_line "$OUT" "No errors were found on the image."
}

serve_case cluster_size=64k 65536 "" --aio
serve_case cluster_size=4k 4096 "" --aio
serve_case cluster_size=512 512 ""
serve_case cluster_size=2M 2097152 ""
serve_case compat=0.10,cluster_size=16k 16384 "" --aio
serve_case extended_l2=on 65536 "" --aio
serve_case extended_l2=on,cluster_size=16k 16384 ""
serve_case lazy_refcounts=on 65536 ""
for rb in 1 4 8 32 64; do
	serve_case refcount_bits=$rb,cluster_size=4k 4096 ""
done
serve_case preallocation=metadata,cluster_size=16k 16384 ""
serve_case preallocation=falloc 65536 ""
serve_case preallocation=full,cluster_size=8k 8192 "" --aio
serve_case compression_type=zstd 65536 ""
serve_case data_file=s.data,cluster_size=4k 4096 "" --no-discard
serve_case cluster_size=64k 65536 ",l2-cache-size=64k" --aio
serve_case cluster_size=64k 65536 ",cow-zeroing=buffers"
serve_case cluster_size=64k 65536 ",cow-zeroing=write-zeroes" --aio
if have_odirect; then
	serve_case cluster_size=4k 4096 ",cache=none,aio=io_uring" --aio
	serve_case cluster_size=64k 65536 ",cache=none,aio=threads"
fi

# A backing chain: writes land in the overlay, the base stays as it was.
echo "== backing file"
rm -f base.qcow2 base.raw ov.qcow2 ov.raw
pattern_raw base.raw "$SIZE" 77
img convert -q -f raw -O qcow2 -o cluster_size=16k base.raw base.qcow2
cp base.raw ov.raw
img create -q -f qcow2 -b base.qcow2 -F qcow2 ov.qcow2
nbd_serve --image d,file=ov.qcow2,format=qcow2 --nbd unix="$sock",image=d,writable=on
run_workload "$(nbd_uri d "$sock")" ov.raw 900 65536 --aio --no-discard
nbd_stop
qcheck ov.qcow2
qcheck base.qcow2
qemu-img compare -q -f raw -F qcow2 ov.raw ov.qcow2 || fail "overlay content differs"
qemu-img compare -q -f raw -F qcow2 base.raw base.qcow2 || fail "the backing file changed"
echo "serve: $n create variants written over NBD, all clean and equal"
