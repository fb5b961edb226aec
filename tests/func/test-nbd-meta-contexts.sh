#!/bin/bash
# NBD metadata contexts beyond base:allocation, the same client script against ioplane and
# qemu-storage-daemon: an export with bitmaps.N= and allocation-depth=on (qsd's keyval
# form) lists qemu:allocation-depth and qemu:dirty-bitmap:NAME; nbdinfo --map of each
# bitmap (QEMU-made, granularities 64 KiB and 4 KiB, bits from writes, write-zeroes and
# a write ioplane gets over NBD) and of the allocation depth of a two-layer chain, and
# qemu-img map with x-dirty-bitmap, are the same from both servers. Bad bitmaps= are
# refused with qsd's messages. The bitmaps ioplane saved at SIGTERM read the same
# through qsd.
. "$(dirname "$0")/nbd-lib.sh"
need qemu-img qemu-io nbdinfo qemu-storage-daemon

cd "$NBD_TMP"
qemu-img create -q -f qcow2 base.qcow2 4M
qemu-io -f qcow2 -c 'write -P 1 0 1M' -c 'write -P 2 3M 512k' base.qcow2 >/dev/null
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2 4M
qemu-img bitmap --add top.qcow2 b0
qemu-img bitmap --add -g 4096 top.qcow2 b1
qemu-img bitmap --add top.qcow2 off
qemu-img bitmap --disable top.qcow2 off
qemu-io -f qcow2 -c 'write -P 3 512k 1M' -c 'write -z 2M 64k' -c 'write 3300k 4k' \
	top.qcow2 >/dev/null

# start KIND EXPORT-OPTIONS: a daemon on its own copy of the chain; sets PID, SOCK.
start() {
	local kind=$1 i
	shift
	cp base.qcow2 "b-$kind.qcow2"
	cp top.qcow2 "t-$kind.qcow2"
	qemu-img rebase -u -b "b-$kind.qcow2" -F qcow2 "t-$kind.qcow2"
	SOCK=$NBD_TMP/$kind.sock
	rm -f "$SOCK"
	local -a cmd=(qemu-storage-daemon)
	[ "$kind" = qsd ] || cmd=("$IOPLANE" serve -q)
	"${cmd[@]}" --blockdev "driver=file,filename=t-$kind.qcow2,node-name=f" \
		--blockdev driver=qcow2,file=f,node-name=q \
		--nbd-server "addr.type=unix,addr.path=$SOCK" \
		--export "type=nbd,id=e,node-name=q,name=d,$1" </dev/null >"$kind.log" 2>&1 &
	PID=$!
	nbd_pids+=("$PID")
	nbd_logs+=("$NBD_TMP/$kind.log")
	for ((i = 0; i < 200; i++)); do
		[ -S "$SOCK" ] && return 0
		kill -0 "$PID" 2>/dev/null || return 1
		sleep 0.05
	done
	fail "$kind: no socket after 10 s"
}

stop() {
	kill "$PID"
	wait "$PID" || true
	nbd_forget "$PID"
}

for kind in qsd ioplane; do
	start $kind "bitmaps.0=b0,bitmaps.1=b1,bitmaps.2=off,allocation-depth=on,writable=on"
	u="nbd+unix:///d?socket=$SOCK"
	# One more write, through this server: both bitmaps must see it.
	qemu-io -f raw -c 'write -P 9 1536k 8k' "$u" >/dev/null
	{
		for ctx in qemu:dirty-bitmap:b0 qemu:dirty-bitmap:b1 qemu:dirty-bitmap:off \
			qemu:allocation-depth; do
			echo "== $ctx"
			nbdinfo --map="$ctx" "$u"
			echo "== $ctx, one extent"
			nbdinfo --map="$ctx" --totals "$u"
		done
		echo "== contexts"
		nbdinfo --list "$u" | sed -n '/contexts:/,/is_/p' | grep -v is_
		echo "== qemu-img map"
		qemu-img map --output=json --image-opts \
			"driver=nbd,server.type=unix,server.path=$SOCK,export=d,x-dirty-bitmap=qemu:dirty-bitmap:b1"
	} >"$kind.out" 2>&1
	stop
	# Refused exports: a missing bitmap, an enabled one on a read-only export. The
	# daemon exits at start-up.
	for bad in bitmaps.0=nope bitmaps.0=b0; do
		cmd=(qemu-storage-daemon)
		[ "$kind" = qsd ] || cmd=("$IOPLANE" serve -q)
		rc=0
		cp top.qcow2 bad.qcow2 # qsd exits leaving the bitmaps in use
		timeout 30 "${cmd[@]}" --blockdev "driver=file,filename=bad.qcow2,node-name=f" \
			--blockdev driver=qcow2,file=f,node-name=q \
			--nbd-server "addr.type=unix,addr.path=$NBD_TMP/bad.sock" \
			--export "type=nbd,id=e,node-name=q,name=d,$bad" </dev/null >"$kind.log" 2>&1 ||
			rc=$?
		[ $rc = 1 ] || fail "$kind: export with $bad: exit $rc"
		grep -o "Bitmap 'nope' is not found\|Enabled bitmap 'b0' incompatible with readonly export" \
			"$kind.log" >>"$kind.err" || fail "$kind: $bad: $(cat "$kind.log")"
	done
done
diff -u qsd.out ioplane.out || fail "the maps differ (qsd -, ioplane +)"
# What ioplane saved at SIGTERM (QEMU-made bitmaps it kept up to date, with the write it
# got over NBD) is what qsd then exports.
for b in b0 b1; do
	sed -n "/^== qemu:dirty-bitmap:$b\$/,/^==/p" ioplane.out | sed '1d;$d' >"saved-$b.want"
	grep -q dirty "saved-$b.want" || fail "no dirty extent of $b in ioplane.out"
done
qemu-img rebase -u -b base.qcow2 -F qcow2 t-ioplane.qcow2
cp t-ioplane.qcow2 t-qsd.qcow2
rm -f "$NBD_TMP/qsd.sock"
qemu-storage-daemon --blockdev driver=file,filename=t-qsd.qcow2,node-name=f \
	--blockdev driver=qcow2,file=f,node-name=q \
	--nbd-server "addr.type=unix,addr.path=$NBD_TMP/qsd.sock" \
	--export type=nbd,id=e,node-name=q,name=d,bitmaps.0=b0,bitmaps.1=b1,writable=on \
	</dev/null >qsd2.log 2>&1 &
PID=$!
nbd_pids+=("$PID")
for ((i = 0; i < 200; i++)); do
	[ -S "$NBD_TMP/qsd.sock" ] && break
	sleep 0.05
done
for b in b0 b1; do
	nbdinfo --map=qemu:dirty-bitmap:$b "nbd+unix:///d?socket=$NBD_TMP/qsd.sock" >"saved-$b.out" ||
		fail "qsd on the image ioplane saved: $(cat qsd2.log)"
	diff -u "saved-$b.want" "saved-$b.out" || fail "bitmap $b as ioplane saved it, read by qsd"
done
stop
diff -u qsd.err ioplane.err || fail "the refusals differ"
grep -q "qemu:dirty-bitmap:b1" ioplane.out || fail "no bitmap context listed"
grep -q "1  dirty" ioplane.out || fail "no dirty extent seen"
grep -q "backing depth 2" ioplane.out || fail "no extent of depth 2 seen"
echo "meta contexts: bitmaps, allocation depth and qemu-img map as qsd's"
