#!/bin/bash
# A qcow2 chain that comes back to itself - an image that is its own backing file, two
# images backing each other, an image whose external data file is the image itself or one
# of its backing files - is refused at open by every command that opens the chain (img
# check too, which opens the chain as qemu-img check does), with a message that says so,
# whatever the locking setting; nothing hangs and no file changes. (An image that is its
# own data file had guest writes land on its header; a backing loop was opened 64 deep.
# qemu-io on a self-backed image spins and grows without bound, so it is not run here.)
. "$(dirname "$0")/img-lib.sh"

qemu-img create -q -f qcow2 self.qcow2 1M
qemu-img rebase -q -u -b self.qcow2 -F qcow2 self.qcow2
qemu-img create -q -f qcow2 p.qcow2 1M
qemu-img create -q -f qcow2 -b p.qcow2 -F qcow2 q.qcow2
qemu-img rebase -q -u -b q.qcow2 -F qcow2 p.qcow2
qemu-img create -q -f qcow2 -o data_file=d.raw own.qcow2 1M
qemu-img amend -q -o data_file=own.qcow2 own.qcow2
qemu-img create -q -f qcow2 base.qcow2 1M
qemu-img create -q -f qcow2 -o data_file=d2.raw -b base.qcow2 -F qcow2 top.qcow2 1M
qemu-img amend -q -o data_file=base.qcow2 top.qcow2
qemu-img info own.qcow2 | grep -q 'data file: own.qcow2' || fail "the crafted image has no data file"

sockdir=$(mktemp -d /tmp/ioplane-loop.XXXXXX)
at_exit "rm -rf '$sockdir'"
sums() { md5sum self.qcow2 p.qcow2 q.qcow2 own.qcow2 base.qcow2 top.qcow2; }
before=$(sums)

# refused WORDS IMAGE CMD...: CMD exits 1 within 10 s; its error names IMAGE and WORDS.
refused() {
	local words=$1 image=$2 rc=0
	shift 2
	timeout -k 2 10 "$@" </dev/null >"$OUT" 2>"$ERR" || rc=$?
	[ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$* hangs"
	[ $rc -eq 1 ] || { cat "$ERR" >&2; fail "$*: exit $rc, not 1"; }
	grep -qF -- "'$image'" "$ERR" && grep -qF -- "$words" "$ERR" || {
		cat "$ERR" >&2
		fail "$*: the error does not name '$image' and '$words'"
	}
}

loop='creates an infinite loop'
own='is the image itself or one of its backing files'
for lk in on off; do
	echo "== locking=$lk"
	# IMAGE:BACKING - the error names the backing file that closes the loop.
	for pair in self.qcow2:self.qcow2 p.qcow2:q.qcow2 q.qcow2:p.qcow2; do
		img=${pair%%:*} b=${pair#*:}
		refused "$loop" "$b" "$IOPLANE" img info --backing-chain "$img"
		# check opens the chain as qemu-img check does (which spins on self.qcow2)
		refused "$loop" "$b" "$IOPLANE" img check "$img"
		refused "$loop" "$b" "$IOPLANE" img map "$img"
		refused "$loop" "$b" "$IOPLANE" bench -c 1 -w "$img"
		refused "$loop" "$b" "$IOPLANE" serve \
			--image "d,file=$img,format=qcow2,writable=on,locking=$lk" \
			--nbd "unix=$sockdir/s,image=d"
	done
	refused "$own" own.qcow2 "$IOPLANE" img info own.qcow2
	refused "$own" own.qcow2 "$IOPLANE" bench -c 1 -w own.qcow2
	refused "$own" own.qcow2 "$IOPLANE" serve \
		--image "d,file=own.qcow2,format=qcow2,writable=on,locking=$lk" \
		--nbd "unix=$sockdir/s,image=d"
	refused "is the image's data file too" base.qcow2 "$IOPLANE" img map top.qcow2
	refused "is the image's data file too" base.qcow2 "$IOPLANE" serve \
		--image "d,file=top.qcow2,format=qcow2,writable=on,locking=$lk" \
		--nbd "unix=$sockdir/s,image=d"
done
grep -qF "backing file 'q.qcow2' $loop" < <("$IOPLANE" img map p.qcow2 2>&1) ||
	fail "the loop is not named at the image that was opened"
[ "$(sums)" = "$before" ] || fail "a refused open changed a file"

# A chain that only looks alike (two images with the same backing file) still opens.
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 o1.qcow2
qemu-img create -q -f qcow2 -b o1.qcow2 -F qcow2 o2.qcow2
img info --backing-chain o2.qcow2
img check o2.qcow2
echo "ok"
