#!/bin/bash
# The qcow2 keys of `serve --image` that --help and the man page describe, each next to
# qemu-storage-daemon serving the same image the same way: the backing chain the header
# names, backing=PATH and backing-format= instead of it, backing= (empty) for none, and an
# external data file from the header or data-file=. Both exports are read whole with
# qemu-img convert and must give the same bytes, and these must differ where the choice of
# file matters (so the comparison is not vacuous).
. "$(dirname "$0")/nbd-lib.sh"

nbd_need_ioplane
[ -z "$NBD_TEST_PEER" ] || skip "this test runs qemu-storage-daemon itself"
need qemu-storage-daemon qemu-img qemu-io

cd "$NBD_TMP"
sock=$NBD_TMP/s.sock
qio() { local f=$1; shift; qemu-io -f qcow2 "$@" "$f" >/dev/null; }

qemu-img create -q -f qcow2 base.qcow2 4M
qio base.qcow2 -c 'write -P 0x11 0 1M' -c 'write -P 0x12 2M 1M'
qemu-img create -q -f qcow2 other.qcow2 4M
qio other.qcow2 -c 'write -P 0x21 0 4M'
truncate -s 4M other.raw
qemu-io -f raw -c 'write -P 0x31 1M 2M' other.raw >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2
qio top.qcow2 -c 'write -P 0x41 512k 1M'
# No backing format: qemu-img 7.2 makes none, so its header extension is renamed to one
# that every reader skips.
qemu-img create -q -f qcow2 -u -b base.qcow2 -F qcow2 nofmt.qcow2 4M
python3 - nofmt.qcow2 <<'PY'
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    h = f.read(4096)
    off = struct.unpack('>I', h[100:104])[0]
    while True:
        t, n = struct.unpack('>II', h[off:off + 8])
        assert t, 'no backing format extension'
        if t == 0xe2792aca:
            f.seek(off)
            f.write(struct.pack('>I', 0x0a0b0c0d))
            break
        off += 8 + (n + 7) // 8 * 8
PY
qemu-img info nofmt.qcow2 | grep -q "^backing file format" && fail "nofmt.qcow2 has a format"
qemu-img create -q -f qcow2 -o data_file=data.raw dfile.qcow2 4M
qio dfile.qcow2 -c 'write -P 0x51 1M 1M'
cp data.raw data2.raw
qemu-io -f raw -c 'write -P 0x52 1M 512k' data2.raw >/dev/null

# read_ioplane OUT SPEC / read_qsd OUT BLOCKDEV...: the whole export, read over NBD.
read_ioplane() {
	nbd_serve --image "d,$2" --nbd "unix=$sock,image=d"
	qemu-img convert -f raw -O raw "nbd+unix:///d?socket=$sock" "$1"
	nbd_stop
}
read_qsd() {
	local out=$1 pid i
	shift
	qemu-storage-daemon "$@" --nbd-server "addr.type=unix,addr.path=$sock" \
		--export type=nbd,id=e,node-name=d,name=d </dev/null >qsd.log 2>&1 &
	pid=$!
	for ((i = 0; i < 200; i++)); do
		nbd_unix_listening "$sock" && break
		kill -0 "$pid" 2>/dev/null || fail "qemu-storage-daemon $*: $(cat qsd.log)"
		sleep 0.05
	done
	qemu-img convert -f raw -O raw "nbd+unix:///d?socket=$sock" "$out"
	kill "$pid"
	wait "$pid" || true
}

# same NAME SPEC BLOCKDEV...: ioplane's export of SPEC reads as qsd's of BLOCKDEV...
same() {
	local name=$1 spec=$2
	shift 2
	read_ioplane "$name.io" "$spec"
	read_qsd "$name.qsd" "$@"
	cmp "$name.qsd" "$name.io" || fail "$name: serve --image d,$spec reads otherwise than qsd"
	echo "$name: as qemu-storage-daemon"
}
FF=file.driver=file,file.filename
same chain file=top.qcow2,format=qcow2 \
	--blockdev "driver=qcow2,node-name=d,$FF=top.qcow2"
same backing-path file=top.qcow2,format=qcow2,backing=other.qcow2,backing-format=qcow2 \
	--blockdev "driver=qcow2,node-name=o,$FF=other.qcow2" \
	--blockdev "driver=qcow2,node-name=d,$FF=top.qcow2,backing=o"
same backing-raw file=top.qcow2,format=qcow2,backing=other.raw,backing-format=raw \
	--blockdev "driver=raw,node-name=o,$FF=other.raw" \
	--blockdev "driver=qcow2,node-name=d,$FF=top.qcow2,backing=o"
same backing-none file=top.qcow2,format=qcow2,backing= \
	--blockdev '{"driver": "qcow2", "node-name": "d", "backing": null,
		"file": {"driver": "file", "filename": "top.qcow2"}}'
same backing-format file=nofmt.qcow2,format=qcow2,backing-format=qcow2 \
	--blockdev "driver=qcow2,node-name=b,$FF=base.qcow2" \
	--blockdev "driver=qcow2,node-name=d,$FF=nofmt.qcow2,backing=b"
same data-file file=dfile.qcow2,format=qcow2 \
	--blockdev "driver=qcow2,node-name=d,$FF=dfile.qcow2"
same data-file-key file=dfile.qcow2,format=qcow2,data-file=data2.raw \
	--blockdev "driver=file,filename=data2.raw,node-name=df" \
	--blockdev "driver=qcow2,node-name=d,$FF=dfile.qcow2,data-file=df"

for pair in "chain backing-path" "chain backing-raw" "chain backing-none" \
	"backing-path backing-raw" "data-file data-file-key"; do
	# shellcheck disable=SC2086
	set -- $pair
	! cmp -s "$1.io" "$2.io" || fail "$1 and $2 read the same: the case tests nothing"
done
# A backing file whose format nothing declares is refused, never probed.
run_status 1 "$IOPLANE" serve --image d,file=nofmt.qcow2,format=qcow2 --nbd "unix=$sock,image=d"
expect_grep "$ERR" "backing-format="
echo "PASS"
