#!/bin/bash
# Formats are never guessed wrongly. An image of another format - qcow, qed, vmdk (sparse
# and descriptor), vdi, vhdx, vpc, parallels, made by qemu-img; bochs, cloop, luks, dmg
# (by name and by its trailer), crafted from their specifications - is refused by every
# ioplane command that probes, naming the format qemu-img names (convert -O raw of a vmdk
# used to write 128 KiB of container bytes and exit 0; img info called vdi/vhdx/qed raw).
# serve without format= takes only raw on a guess, and, as QEMU does for a probed raw
# image, refuses writes that would make its first sector look like another format (the
# same qemu-io script runs against qemu-io on the file itself); format=raw lifts that.
. "$(dirname "$0")/img-lib.sh"
. "$IMG_LIB_DIR/nbd-lib.sh"

for f in qcow qed vmdk vdi vhdx vpc parallels; do
	qemu-img create -q -f $f img.$f 1M
done
qemu-img create -q -f vmdk -o subformat=monolithicFlat desc.vmdk 1M
python3 - <<'PY'
import struct
def image(name, size, *parts):
    b = bytearray(size)
    for off, data in parts:
        b[off:off + len(data)] = data
    open(name, 'wb').write(b)
image('img.bochs', 4096, (0, b'Bochs Virtual HD Image\0'), (32, b'Redolog\0'),
      (48, b'Growing\0'), (64, struct.pack('<I', 0x20000)))
image('img.cloop', 4096, (0, b'#!/bin/sh\n#V2.0 Format\n'
      b'modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n'))
image('img.luks', 4096, (0, b'LUKS\xba\xbe\0\1'))
image('img.dmg', 4096)
image('trailer.img', 8192, (8192 - 512, b'koly'))
PY
qemu-img create -q -f raw plain.raw 1M
qemu-img create -q -f qcow2 plain.qcow2 1M

# want NAME: the format ioplane must name for image NAME.
want() {
	case $1 in
	desc.vmdk) echo vmdk ;;
	trailer.img) echo dmg ;;
	*) echo "${1##*.}" ;;
	esac
}

for f in img.* desc.vmdk trailer.img; do
	w=$(want "$f")
	echo "== $f ($w)"
	# qemu-img probes it as that format too (it cannot open some of the crafted ones,
	# but it does not take them for raw); a dmg trailer without the name is ioplane's
	# addition.
	if [ "$f" != trailer.img ]; then
		q=$(qemu-img info "$f" 2>&1 || true)
		if grep -q '^file format:' <<<"$q"; then
			grep -qx "file format: $w" <<<"$q" || fail "qemu-img calls $f: $q"
		fi
		! grep -qx 'file format: raw' <<<"$q" || fail "qemu-img takes $f for raw"
	fi
	for cmd in "info $f" "check $f" "map $f" "convert -O raw $f out.raw" \
		"convert -O qcow2 $f out.qcow2" "resize $f 2M" "compare $f plain.raw"; do
		# shellcheck disable=SC2086 # word splitting of cmd intended
		run_status "$([ "${cmd%% *}" = compare ] && echo 2 || echo 1)" "$IOPLANE" img $cmd
		expect_grep "$ERR" "'$f' is a $w image"
	done
	[ ! -e out.raw ] && [ ! -e out.qcow2 ] || fail "convert of $f wrote an output"
	run_status 1 "$IOPLANE" bench -c 1 "$f"
	expect_grep "$ERR" "is a $w image"
	run_status 1 "$IOPLANE" serve --image "d,file=$f" --nbd "unix=$T/s,image=d"
	expect_grep "$ERR" "'$f' is a $w image"
	# Named explicitly, the bytes are the user's to have.
	img info -f raw "$f"
	expect_line "$OUT" "file format: raw"
done

echo "== a qcow2 image is probed by img and bench, never by serve"
img info plain.qcow2
expect_line "$OUT" "file format: qcow2"
run_ok "$IOPLANE" bench -q -c 16 -w plain.qcow2
qcheck plain.qcow2
run_status 1 "$IOPLANE" serve --image "d,file=plain.qcow2" --nbd "unix=$T/s,image=d"
expect_grep "$ERR" "is a qcow2 image.*give format=qcow2"

echo "== the first sector of a probed raw image keeps its format"
head -c 512 plain.qcow2 >hdr.qcow2
head -c 512 img.vmdk >hdr.vmdk
printf 'QFI\373\0\0\0\3' >magic8
# sector0 TARGET [QEMU-IO OPTIONS]: the same writes through any client: whole headers and
# a short one (read-modify-write) are refused, plain data is written.
sector0() {
	local t=$1 out
	shift
	for h in hdr.qcow2 hdr.vmdk; do
		out=$(qemu-io "$@" -c "write -s $h 0 512" "$t" 2>&1 || true)
		grep -q 'Operation not permitted' <<<"$out" || fail "$t: $h written: $out"
	done
	out=$(qemu-io "$@" -c "write -s magic8 0 8" "$t" 2>&1 || true)
	grep -q 'Operation not permitted' <<<"$out" || fail "$t: 8-byte qcow2 magic written: $out"
	out=$(qemu-io "$@" -c "write -P 0x51 0 4" -c "write -P 0x55 512 512" \
		-c "read -P 0x51 0 4" -c "read -P 0 4 508" -c "read -P 0x55 512 512" "$t" 2>&1)
	! grep -qiE 'fail|error|not permitted' <<<"$out" || fail "$t: plain writes: $out"
}
qemu-img create -q -f raw probed.raw 1M
sector0 probed.raw # qemu-io probes the file itself
qemu-img create -q -f raw probed.raw 1M
nbd_serve --image "d,file=$T/probed.raw" --nbd "unix=$T/n.sock,image=d,writable=on"
expect_grep "$NBD_LOG" "probing guessed raw"
sector0 "$(nbd_uri d "$T/n.sock")" -f raw
nbd_stop
cmp -n 4 probed.raw <(printf 'QQQQ') || fail "the plain write did not reach the file"

echo "== format=raw lifts the guard"
nbd_serve --image "d,file=$T/probed.raw,format=raw" --nbd "unix=$T/n.sock,image=d,writable=on"
! grep -q "probing guessed raw" "$NBD_LOG" || fail "format=raw logged as probed"
nbd_qemu_io "$(nbd_uri d "$T/n.sock")" "write -s hdr.qcow2 0 512" >/dev/null
nbd_stop
cmp -n 512 probed.raw hdr.qcow2 || fail "format=raw: the header was not written"
echo "PASS"
