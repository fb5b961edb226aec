#!/bin/bash
# `ioplane img snapshot -l` lists what `qemu-img snapshot -c` made, byte for byte as
# `qemu-img snapshot -l` does (none, one, several with odd names, after writes and a
# deletion; -U while another process holds the image), and prints nothing for an image
# without snapshots or a raw one; mixing actions gets qemu-img's message.
# -c, -a and -d, taking turns with qemu-img on one image (standard, version 2, extended
# L2, 512-byte and 2 MiB clusters, compressed clusters): each tool lists and uses what the
# other made, `qemu-img check` finds every step clean (no leak), each snapshot's view
# (qemu-img convert -l) keeps the data it was taken with whatever is written, zeroed or
# discarded later, and -a restores it exactly; img info (human and JSON) lists them as
# qemu-img info does; errors get qemu-img's messages.
. "$(dirname "$0")/img-lib.sh"

# same_list ARGS... FILE: both tools print the same list (and both succeed).
same_list() {
	local want file=${*: -1}
	want=$(qemu-img snapshot "${@:1:$#-1}" -l "$file") || fail "qemu-img snapshot -l $*"
	img snapshot "${@:1:$#-1}" -l "$file"
	[ "$(cat "$OUT")" = "$want" ] || { diff <(echo "$want") "$OUT" >&2; fail "list of $*"; }
}

qemu-img create -q -f qcow2 s.qcow2 16M
same_list s.qcow2
[ ! -s "$OUT" ] || fail "a list for an image without snapshots"
qemu-io -c 'write -P 0x11 0 1M' s.qcow2 >/dev/null
qemu-img snapshot -c first s.qcow2
same_list s.qcow2
expect_grep "$OUT" '^1 +first +0 B '
qemu-io -c 'write -P 0x22 0 1M' s.qcow2 >/dev/null
qemu-img snapshot -c 'with spaces and a very long name indeed' s.qcow2
qemu-img snapshot -c third s.qcow2
qemu-img snapshot -d first s.qcow2
same_list s.qcow2
[ "$(grep -c '^[0-9]' "$OUT")" = 2 ] || fail "two snapshots after the deletion"
same_list -q s.qcow2

# Held by another process: -U, as qemu-img.
timeout 60 qemu-io -c 'sleep 60000' s.qcow2 >qemu-io.log 2>&1 &
holder=$!
image_locked s.qcow2 30 || { cat qemu-io.log >&2; fail "qemu-io did not lock the image within 30 s"; }
img_status 1 snapshot -l s.qcow2
same_list -U s.qcow2
kill "$holder"
wait "$holder" 2>/dev/null || true
wait_unlocked s.qcow2

truncate -s 1M r.raw
same_list r.raw
[ ! -s "$OUT" ] || fail "a list for a raw image"

before=$(qemu-img snapshot -l s.qcow2)
img_status 1 snapshot -l -c x s.qcow2
expect_line "$ERR" "ioplane img: Cannot mix '-l', '-a', '-c', '-d'"
[ "$(qemu-img snapshot -l s.qcow2)" = "$before" ] || fail "a refused action changed the image"
qcheck s.qcow2

# same_err ARGS...: both tools fail alike (qemu-img's message after the program name is
# ioplane's last line; ioplane may say why before it).
same_err() {
	local want
	want=$(qemu-img snapshot "$@" 2>&1 >/dev/null) && fail "qemu-img snapshot $* succeeded"
	img_status 1 snapshot "$@"
	[ "$(tail -n 1 "$ERR" | sed 's/^ioplane img: //')" = "${want#qemu-img: }" ] ||
		fail "snapshot $*: '$(cat "$ERR")', qemu-img: '$want'"
}
same_err -a nope s.qcow2
same_err -d nope s.qcow2
same_err -d 3 s.qcow2 # -d finds names only
same_err -U -c x s.qcow2
[ "$(qemu-img snapshot -l s.qcow2)" = "$before" ] || fail "a failed action changed the image"

# view IMG NAME: the snapshot's content, as qemu-img reads it.
view() { qemu-img convert -f qcow2 -O raw -l "snapshot.name=$2" "$1" "view-$2.raw"; }
# active IMG: the active content.
active() { qemu-img convert -f qcow2 -O raw "$1" "active.raw"; }

for opts in "" "compat=0.10" "extended_l2=on" "cluster_size=512" "cluster_size=2M" "refcount_bits=8"; do
	rm -f t.qcow2
	qemu-img create -q -f qcow2 ${opts:+-o $opts} t.qcow2 8M
	qemu-io -c 'write -P 0x11 0 3M' -c 'write -c -P 0x12 4M 1M' t.qcow2 >/dev/null 2>&1 ||
		qemu-io -c 'write -P 0x11 0 3M' -c 'write -P 0x12 4M 1M' t.qcow2 >/dev/null
	active t.qcow2 && mv active.raw a0.raw
	img snapshot -c one t.qcow2
	qcheck t.qcow2
	same_list t.qcow2
	qemu-io -c 'write -P 0x22 0 1M' -c 'write -z 1M 512k' -c 'discard 2M 1M' \
		-c 'write -P 0x23 4M 4k' -c 'write -P 0x24 6M 64k' t.qcow2 >/dev/null
	view t.qcow2 one && cmp view-one.raw a0.raw || fail "[$opts] snapshot one changed"
	active t.qcow2 && mv active.raw a1.raw
	qemu-img snapshot -c two t.qcow2 # made by qemu-img, used by ioplane
	img snapshot -c three t.qcow2    # a name repeated: allowed, as qemu-img
	img snapshot -c three t.qcow2
	same_list t.qcow2
	qcheck t.qcow2
	for o in human json; do # img info lists them as qemu-img info does
		img info --output=$o t.qcow2
		[ "$(cat "$OUT")" = "$(qemu-img info --output=$o t.qcow2)" ] ||
			fail "[$opts] img info --output=$o differs from qemu-img's"
	done
	img snapshot -a one t.qcow2
	qcheck t.qcow2
	active t.qcow2 && cmp active.raw a0.raw || fail "[$opts] apply one"
	view t.qcow2 two && cmp view-two.raw a1.raw || fail "[$opts] snapshot two after apply"
	img snapshot -d three t.qcow2 # the first of the two
	qcheck t.qcow2
	qemu-img snapshot -l t.qcow2 | grep -q '^4 *three' || fail "[$opts] -d deleted the wrong one"
	qemu-img snapshot -a two t.qcow2
	img snapshot -d one t.qcow2
	qcheck t.qcow2
	active t.qcow2 && cmp active.raw a1.raw || fail "[$opts] content after deleting one"
	img snapshot -a 2 t.qcow2 # by id
	img snapshot -d two t.qcow2
	qemu-img snapshot -d three t.qcow2
	qcheck t.qcow2
	active t.qcow2 && cmp active.raw a1.raw || fail "[$opts] content after deleting all"
	img snapshot -l t.qcow2
	[ ! -s "$OUT" ] || fail "[$opts] snapshots left"
done

# Extra data a newer writer added to an entry (past icount) is kept when ioplane
# rewrites the table, as QEMU keeps it.
qemu-img create -q -f qcow2 t.qcow2 8M
qemu-img snapshot -c one t.qcow2
extra_py() { # FILE set|get
	python3 - "$@" <<-'EOF'
	import struct, sys
	path, what = sys.argv[1:3]
	d = bytearray(open(path, 'rb').read())
	n, off = struct.unpack_from('>IQ', d, 60)
	pos = off
	for i in range(n):
	    idl, nml = struct.unpack_from('>HH', d, pos + 12)
	    extra = struct.unpack_from('>I', d, pos + 36)[0]
	    if i == 0 and what == 'set':
	        ent = d[pos:pos + 40 + extra + idl + nml]
	        struct.pack_into('>I', ent, 36, extra + 8)
	        ent = ent[:40 + extra] + b'\xab' * 8 + ent[40 + extra:]
	        ent += bytes(-len(ent) % 8)
	        d[pos:pos + len(ent)] = ent
	        open(path, 'wb').write(d)
	        sys.exit(0)
	    if i == 0:
	        print(extra, d[pos + 64:pos + 72].hex())
	    pos += (40 + extra + idl + nml + 7) // 8 * 8
	EOF
}
extra_py t.qcow2 set
[ "$(extra_py t.qcow2 get)" = "32 abababababababab" ] || fail "extra data not set up"
qcheck t.qcow2
img snapshot -c two t.qcow2
[ "$(extra_py t.qcow2 get)" = "32 abababababababab" ] || fail "extra data lost: $(extra_py t.qcow2 get)"
img snapshot -d two t.qcow2
[ "$(extra_py t.qcow2 get)" = "32 abababababababab" ] || fail "extra data lost on delete"
qcheck t.qcow2
same_list t.qcow2

# Refcounts that cannot count one reference more (1 bit; 2 bits with many compressed
# clusters in one host cluster): refused as by qemu-img, but with the references counted
# so far dropped again, where qemu-img leaks them.
for bits in 1 2; do
	qemu-img create -q -f qcow2 -o refcount_bits=$bits t.qcow2 8M
	qemu-io -c 'write -P 0x11 0 3M' -c 'write -c -P 0x12 4M 1M' t.qcow2 >/dev/null
	active t.qcow2 && mv active.raw a0.raw
	cp t.qcow2 t2.qcow2
	same_err -c one t2.qcow2
	img_status 1 snapshot -c one t.qcow2
	qcheck t.qcow2
	active t.qcow2 && cmp active.raw a0.raw || fail "refcount_bits=$bits: content changed"
done
echo PASS
