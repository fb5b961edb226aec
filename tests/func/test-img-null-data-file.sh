#!/bin/bash
# The qcow2 open option data-file=null:size=SIZE[,,...]: the metadata comes from the image,
# the guest data from the null driver instead of the external data file (for benchmarks,
# bench/compare-qcow2.sh). Reads through `ioplane serve` (qemu-io over NBD) return the null
# driver's zeroes while the real data file holds a pattern; a null: data file name stored in
# the image header is a file name, never the null driver; `ioplane bench --image-opts`
# opens the same way; neither the image nor the data file changes.
. "$(dirname "$0")/nbd-lib.sh"
. "$(dirname "$0")/img-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "NBD_TEST_PEER: this test is about ioplane's qcow2 driver"
need sha256sum

SIZE=$((4 << 20))
sock=$T/nbd.sock
uri=$(nbd_uri d "$sock")

sums() { sha256sum "$@" | awk '{ print $1 }' | tr '\n' ' '; }

# serve_read SPEC CMD...: serve SPEC read-only, run qemu-io CMDs (read-only) over NBD, stop
# the server. qemu-io does not always exit non-zero when a command fails: its output counts.
serve_read() {
	local spec=$1 c out rc=0
	local -a args=()
	shift
	for c in "$@"; do
		args+=(-c "$c")
	done
	nbd_serve --image "d,$spec,read-only=on" --nbd unix="$sock",image=d
	out=$(timeout 60 qemu-io -r -f raw "$uri" "${args[@]}" 2>&1) || rc=$?
	if [ $rc -ne 0 ] || grep -qiE 'fail|error|mismatch|denied' <<<"$out"; then
		echo "$out" >&2
		fail "$spec: qemu-io $* (exit $rc)"
	fi
	nbd_stop
}

echo "== an allocated image whose data file holds 0x5a"
qemu-img create -q -f qcow2 -o "data_file=$T/d.raw,data_file_raw=on,preallocation=metadata" \
	a.qcow2 $SIZE
qemu-io -f qcow2 -c "write -P 0x5a 0 $SIZE" a.qcow2 >/dev/null
before=$(sums a.qcow2 d.raw)

echo "== without the option: the data file's content"
serve_read "file=a.qcow2,format=qcow2" "read -P 0x5a 0 $SIZE"

echo "== data-file=null:...,read-zeroes=on: zeroes, from the null driver"
serve_read "file=a.qcow2,format=qcow2,data-file=null:size=$SIZE,,read-zeroes=on" \
	"read -P 0 0 $SIZE" "read -P 0 1M 4k"

echo "== a bad null: option is an error naming the data file"
nbd_serve_fails() {
	run_status 1 "$IOPLANE" serve --image "d,file=a.qcow2,format=qcow2,read-only=on,$1" \
		--nbd unix="$sock",image=d
}
nbd_serve_fails "data-file=null:size=$SIZE,,bogus=1"
expect_grep "$ERR" "data file 'null:size=$SIZE,bogus=1'"

echo "== ioplane bench --image-opts with the null data file"
run_ok "$IOPLANE" bench -c 2000 -d 16 --image-opts \
	"driver=file,filename=a.qcow2,format=qcow2,data-file=null:size=$SIZE"
expect_grep "$OUT" '^Run completed in'
run_status 1 "$IOPLANE" bench -f qcow2 --image-opts "driver=file,filename=a.qcow2"
expect_grep "$ERR" 'mutually exclusive'

[ "$(sums a.qcow2 d.raw)" = "$before" ] || fail "the image or its data file changed"

echo "== a data file named null:... in the header is a file"
# (qemu-img would take null: for a protocol: ioplane makes and writes this one.)
img create -q -f qcow2 -o "data_file=null:size=$SIZE,data_file_raw=on" b.qcow2 $SIZE
[ -f "null:size=$SIZE" ] || fail "img create did not make the data file 'null:size=$SIZE'"
run_ok "$IOPLANE" bench -q -f qcow2 -w --pattern=0x33 -s 1M -c 1 b.qcow2
serve_read "file=b.qcow2,format=qcow2" "read -P 0x33 0 1M" "read -P 0 1M 1M"

echo "PASS"
