#!/bin/bash
# Image paths that are not a regular file or a block device - a FIFO, a directory, a unix
# socket, a character device (/dev/zero, /dev/null), and symbolic links to them - are
# refused at once, by every command that opens an image path: serve, bench and every img
# subcommand (as image, convert source and output, create target, backing file, external
# data file). The error names the path and what it is; nothing blocks (a FIFO used to
# hang every command in open()) and nothing is created or written.
. "$(dirname "$0")/img-lib.sh"

mkfifo fifo
mkdir dir
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' sock
ln -s fifo link-fifo
ln -s dir link-dir
ln -s /dev/zero link-zero
qemu-img create -q -f raw good.raw 1M
qemu-img create -q -f qcow2 good.qcow2 1M

# kind PATH: the word the error must use for PATH.
kind() {
	case $1 in
	fifo | link-fifo) echo FIFO ;;
	dir | link-dir) echo directory ;;
	sock) echo socket ;;
	*) echo 'character device' ;;
	esac
}

# refused PATH CMD...: CMD exits non-zero within 10 s and its error names PATH and its kind.
refused() {
	local p=$1 rc=0
	shift
	timeout -k 2 10 "$@" </dev/null >"$OUT" 2>"$ERR" || rc=$?
	[ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$* hangs on $p"
	[ $rc -ne 0 ] || fail "$* accepted $p"
	grep -qF -- "$p" "$ERR" && grep -qiF -- "$(kind "$p")" "$ERR" || {
		cat "$ERR" >&2
		fail "$*: the error does not name '$p' and '$(kind "$p")'"
	}
}

sockdir=$(mktemp -d /tmp/ioplane-naf.XXXXXX)
at_exit "rm -rf '$sockdir'"

for p in fifo dir sock /dev/zero /dev/null link-fifo link-dir link-zero; do
	echo "== $p"
	for f in "" "-f raw" "-f qcow2"; do
		# shellcheck disable=SC2086 # $f is zero or two words
		refused "$p" "$IOPLANE" img info $f "$p"
	done
	refused "$p" "$IOPLANE" img check "$p"
	refused "$p" "$IOPLANE" img map "$p"
	refused "$p" "$IOPLANE" img compare "$p" good.raw
	refused "$p" "$IOPLANE" img compare good.raw "$p"
	refused "$p" "$IOPLANE" img convert -O raw "$p" out.raw
	refused "$p" "$IOPLANE" img resize -f raw "$p" 2M
	refused "$p" "$IOPLANE" bench -c 1 "$p"
	refused "$p" "$IOPLANE" bench -c 1 -w -f raw "$p"
	refused "$p" "$IOPLANE" serve --image "d,file=$p,format=raw" \
		--nbd "unix=$sockdir/s,image=d"
	refused "$p" "$IOPLANE" serve --image "d,driver=file,filename=$p" \
		--nbd "unix=$sockdir/s,image=d"
	[ ! -e out.raw ] || fail "convert of $p left out.raw"
done

# As an output: convert target, create target, external data file; /dev/zero and /dev/null
# are opened for writing here, so this also shows nothing is written to them.
for p in fifo dir sock /dev/zero /dev/null link-fifo link-zero; do
	echo "== output $p"
	refused "$p" "$IOPLANE" img convert -O raw good.raw "$p"
	refused "$p" "$IOPLANE" img convert -O qcow2 good.raw "$p"
	refused "$p" "$IOPLANE" img convert -n -O raw good.raw "$p"
	refused "$p" "$IOPLANE" img create -f raw "$p" 1M
	refused "$p" "$IOPLANE" img create -f qcow2 "$p" 1M
	rm -f new.qcow2
	refused "$p" "$IOPLANE" img create -f qcow2 -o "data_file=$p" new.qcow2 1M
done
[ -p fifo ] && [ -d dir ] && [ -S sock ] || fail "an output special file was replaced"

# As a backing file and as the data file a qcow2 header names.
for p in fifo dir sock /dev/zero link-fifo; do
	echo "== backing and data file $p"
	a=$p
	[ "${p#/}" != "$p" ] || a=$PWD/$p
	refused "$p" "$IOPLANE" img create -f qcow2 -b "$a" -F raw ov.qcow2
	rm -f ov.qcow2
	qemu-img create -q -f qcow2 -u -b "$a" -F raw ov.qcow2 1M
	refused "$p" "$IOPLANE" img info --backing-chain ov.qcow2
	refused "$p" "$IOPLANE" img convert -O raw ov.qcow2 out.raw
	refused "$p" "$IOPLANE" serve --image "d,file=ov.qcow2,format=qcow2" \
		--nbd "unix=$sockdir/s,image=d"
	rm -f ov.qcow2 ext.qcow2 ext.data
	qemu-img create -q -f qcow2 -o data_file=ext.data ext.qcow2 1M
	rm ext.data
	ln -s "$a" ext.data
	refused "$p" "$IOPLANE" img map ext.qcow2
	refused "$p" "$IOPLANE" serve --image "d,file=ext.qcow2,format=qcow2" \
		--nbd "unix=$sockdir/s,image=d"
	rm -f ext.data
done

echo "== regular files and their symbolic links still work"
ln -s good.raw link-good
img info link-good
expect_grep "$OUT" '^file format: raw'
img convert -O qcow2 link-good out.qcow2
qcheck out.qcow2
echo "PASS"
