#!/bin/bash
# Image locking, compatible with QEMU's: ioplane takes the OFD lock bytes QEMU's file
# driver takes (100+bit held, 200+bit not shared), so that each sees the other's.
#  1. Every img command and bench, against a process holding each lock byte, succeeds
#     or is refused exactly as the same qemu-img command is (-U included).
#  2. serve locks the same bytes as qemu-storage-daemon for the same image and export
#     (raw, qcow2, read-only, vhost-user-blk, a raw window, a qcow2 backing file and an
#     external data file); a raw backing file under an export that reads additionally
#     refuses writers and resizers (qemu-storage-daemon lets them in).
#  3. With real peers, both ways: ioplane serving a qcow2 image writable refuses qemu-io,
#     qemu-img, qemu-storage-daemon and a second ioplane (used to corrupt it), and
#     qemu-storage-daemon or qemu-io holding it refuses ioplane's serve, img and bench;
#     read-only users coexist; -U reads; backing and data files are locked;
#     locking=off takes no lock; a stopped server leaves none.
. "$(dirname "$0")/img-lib.sh"
. "$IMG_LIB_DIR/nbd-lib.sh"
need qemu-storage-daemon
python3 -c 'import fcntl; fcntl.F_OFD_SETLK' 2>/dev/null || skip "python3 has no OFD locks"

# locks FILE: the bytes of FILE that some process locks, e.g. "100 101 203".
locks() {
	python3 - "$1" <<'PY'
import os, sys
st = os.stat(sys.argv[1])
me = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
held = set()
for line in open("/proc/locks"):
    f = line.split()
    if f[0].endswith(":") and f[5] == me:
        held.update(range(int(f[6]), int(f[7]) + 1))
print(" ".join(str(b) for b in sorted(held)))
PY
}

# wait_locks FILE: until some process locks FILE (10 s at most).
wait_locks() {
	local i
	for ((i = 0; i < 200; i++)); do
		[ -z "$(locks "$1")" ] || return 0
		sleep 0.05
	done
	fail "nobody locked $1"
}

# hold FILE BYTE: BYTE of FILE held by another process until unhold. One
# holder process serves every hold (a python start per hold made section 1
# take minutes): it opens FILE anew for each request, so a file that fresh
# replaced is the one locked, and closes it on unhold.
holder_start() {
	coproc HOLDER { exec python3 -c '
import fcntl, os, struct, sys
fd = -1
for line in sys.stdin:
    if fd >= 0:
        os.close(fd)
        fd = -1
    w = line.split()
    if w:
        fd = os.open(w[0], os.O_RDONLY)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                    struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, int(w[1]), 1, 0))
    print("held" if w else "free", flush=True)'; }
}
hold() {
	local line
	echo "$1 $2" >&"${HOLDER[1]}"
	read -r line <&"${HOLDER[0]}"
	[ "$line" = held ] || fail "holder did not take byte $2 of $1"
}
unhold() {
	local line
	echo >&"${HOLDER[1]}"
	read -r line <&"${HOLDER[0]}"
	[ "$line" = free ] || fail "holder did not let go"
}

# bg_start NAME CMD...: CMD in the background, stopped when the test exits; sets BG_PID.
bg_start() {
	local log=$T/$1.log
	shift
	"$@" </dev/null >"$log" 2>&1 &
	BG_PID=$!
	nbd_pids+=("$BG_PID")
	nbd_logs+=("$log")
}
bg_stop() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
	nbd_forget "$1"
}

# listen_bg NAME SOCK CMD...: a server in the background, listening on SOCK; sets BG_PID.
listen_bg() {
	local name=$1 sock=$2 i
	shift 2
	bg_start "$name" "$@"
	for ((i = 0; i < 200; i++)); do
		nbd_unix_listening "$sock" && return 0
		kill -0 "$BG_PID" 2>/dev/null || { cat "$T/$name.log" >&2; fail "$name died"; }
		sleep 0.05
	done
	fail "$name does not listen"
}
# serve_bg / qsd_bg NAME SOCK ARGS...: ioplane serve / qemu-storage-daemon with ARGS.
serve_bg() { listen_bg "$1" "$2" "$IOPLANE" serve "${@:3}"; }
qsd_bg() { listen_bg "$1" "$2" qemu-storage-daemon "${@:3}"; }

# refused WHAT CMD...: CMD fails and says why in QEMU's words.
refused() {
	local what=$1 rc=0
	shift
	timeout 60 "$@" </dev/null >"$OUT" 2>"$ERR" || rc=$?
	[ $rc -ne 0 ] || fail "$* succeeded while $what"
	grep -qE 'Failed to get (shared )?"[a-z ]+" lock' "$ERR" || {
		cat "$ERR" >&2
		fail "$*: no lock error"
	}
}
ok() {
	timeout 60 "$@" </dev/null >"$OUT" 2>"$ERR" || {
		cat "$ERR" >&2
		fail "$* failed"
	}
}

# fresh: new r.raw, q.qcow2 and o.raw (copies of images made once) and no
# n.raw or n.qcow2.
mkdir -p tmpl
qemu-img create -q -f raw tmpl/r.raw 1M
qemu-img create -q -f qcow2 tmpl/q.qcow2 1M
qemu-img create -q -f raw tmpl/o.raw 1M
fresh() {
	rm -f r.raw q.qcow2 o.raw n.raw n.qcow2
	cp tmpl/r.raw tmpl/q.qcow2 tmpl/o.raw .
}
qemu-img create -q -f raw b.raw 1M
qemu-img create -q -f qcow2 b.qcow2 1M
qemu-img create -q -f qcow2 -b b.raw -F raw ovb.qcow2
qemu-img create -q -f qcow2 -b b.qcow2 -F qcow2 ovq.qcow2

echo "== 1. img and bench against each lock byte, as qemu-img"
cmds=(
	"info -f raw r.raw|r.raw" "info q.qcow2|q.qcow2" "info -U q.qcow2|q.qcow2"
	"info --backing-chain q.qcow2|q.qcow2" "check q.qcow2|q.qcow2" "check -U q.qcow2|q.qcow2"
	"check -r all q.qcow2|q.qcow2" "map -f raw r.raw|r.raw" "map -U q.qcow2|q.qcow2"
	"compare -f raw -F raw r.raw o.raw|r.raw" "compare -U q.qcow2 o.raw|q.qcow2"
	"convert -f raw -O raw r.raw n.raw|r.raw" "convert -U -f raw -O raw r.raw n.raw|r.raw"
	"convert -O raw q.qcow2 n.raw|q.qcow2" "convert -n -f raw -O raw r.raw o.raw|o.raw"
	"convert -f raw -O raw r.raw o.raw|o.raw" "convert -f raw -O qcow2 r.raw o.raw|o.raw"
	"resize -f raw r.raw 2M|r.raw" "resize -f qcow2 q.qcow2 2M|q.qcow2"
	"create -f raw r.raw 1M|r.raw" "create -f qcow2 r.raw 1M|r.raw"
	"bench -f raw -c 1 r.raw|r.raw" "bench -f raw -w -c 1 r.raw|r.raw"
	"bench -U -f qcow2 -c 1 q.qcow2|q.qcow2" "bench -f qcow2 -c 1 q.qcow2|q.qcow2"
	"info --backing-chain ovb.qcow2|b.raw" "info --backing-chain ovq.qcow2|b.qcow2"
	"map -U ovb.qcow2|b.raw"
)
holder_start
for byte in 100 101 103 200 201 203; do
	nref=0
	for c in "${cmds[@]}"; do
		cmd=${c%|*}
		res=()
		for tool in qemu-img "$IOPLANE img"; do
			fresh
			hold "${c#*|}" "$byte"
			# shellcheck disable=SC2086 # tool and cmd are word lists
			if timeout 60 $tool $cmd >/dev/null 2>err.txt </dev/null; then
				res+=(ok)
			else
				res+=(refused)
			fi
			unhold
		done
		[ "${res[0]}" = "${res[1]}" ] ||
			fail "byte $byte held: '$cmd': qemu-img ${res[0]}, ioplane ${res[1]}: $(cat err.txt)"
		[ "${res[0]}" = ok ] || nref=$((nref + 1))
	done
	# The holder really held the byte: all but 100 (nobody refuses to share
	# consistent reads) turn some command away.
	[ $nref -gt 0 ] || [ $byte = 100 ] || fail "byte $byte held: no command was refused"
	echo "   byte $byte: $nref of ${#cmds[@]} commands refused by both"
done
holder_pid=$HOLDER_PID
eval "exec ${HOLDER[1]}>&-"
wait "$holder_pid" 2>/dev/null || true
echo "   ${#cmds[@]} commands x 6 bytes agree"
# -U with a command that writes is an error, as in qemu-img.
fresh
for cmd in "check -U -r all q.qcow2" "resize -U -f raw r.raw 2M" "bench -U -w -f raw -c 1 r.raw"; do
	# shellcheck disable=SC2086
	run_status 1 "$IOPLANE" img $cmd
	expect_grep "$ERR" "force-share=on can only be used with read-only images"
done

echo "== 2. serve locks the bytes qemu-storage-daemon locks"
S=$T/lk.sock
# same FILE QSD-ARGS -- IOPLANE-ARGS: both servers lock FILE the same way.
same() {
	local f=$1 q o
	local -a qa=() ia=()
	shift
	while [ "$1" != -- ]; do
		qa+=("$1")
		shift
	done
	shift
	ia=("$@")
	qsd_bg qsd "$S" "${qa[@]}"
	q=$(locks "$f")
	bg_stop "$BG_PID"
	serve_bg io "$S" "${ia[@]}"
	o=$(locks "$f")
	bg_stop "$BG_PID"
	[ "$q" = "$o" ] || fail "$f: qemu-storage-daemon locks [$q], ioplane [$o]: ${ia[*]}"
	echo "   $f [$o]: ${ia[*]}"
	[ -z "$(locks "$f")" ] || fail "$f still locked after the server stopped"
}
NBDS=(--nbd-server "addr.type=unix,addr.path=$S")
fresh
qemu-img create -q -f raw base.raw 1M
qemu-img create -q -f qcow2 base.qcow2 1M
qemu-img create -q -f qcow2 -b base.raw -F raw ovr.qcow2
qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 ovbq.qcow2
qemu-img create -q -f qcow2 -o data_file=ext.data ext.qcow2 1M
for w in on off; do
	same r.raw --blockdev driver=raw,file.driver=file,file.filename=r.raw,node-name=r \
		"${NBDS[@]}" --export type=nbd,id=e,node-name=r,writable=$w \
		-- --image r,file=r.raw,format=raw --nbd unix="$S",image=r,writable=$w
	same q.qcow2 --blockdev driver=qcow2,file.driver=file,file.filename=q.qcow2,node-name=r \
		"${NBDS[@]}" --export type=nbd,id=e,node-name=r,writable=$w \
		-- --image r,file=q.qcow2,format=qcow2 --nbd unix="$S",image=r,writable=$w
	same r.raw --blockdev driver=raw,file.driver=file,file.filename=r.raw,node-name=r \
		--export type=vhost-user-blk,id=e,node-name=r,addr.type=unix,addr.path="$S",writable=$w \
		-- --image r,file=r.raw,format=raw --vhost-user-blk unix="$S",image=r,writable=$w
	same ext.data --blockdev driver=qcow2,file.driver=file,file.filename=ext.qcow2,node-name=r \
		"${NBDS[@]}" --export type=nbd,id=e,node-name=r,writable=$w \
		-- --image r,file=ext.qcow2,format=qcow2 --nbd unix="$S",image=r,writable=$w
done
same r.raw --blockdev driver=file,filename=r.raw,node-name=f,read-only=on \
	--blockdev driver=raw,file=f,node-name=r,read-only=on "${NBDS[@]}" \
	--export type=nbd,id=e,node-name=r \
	-- --image r,file=r.raw,format=raw,read-only=on --nbd unix="$S",image=r
same q.qcow2 --blockdev driver=qcow2,file.driver=file,file.filename=q.qcow2,node-name=r,read-only=on \
	"${NBDS[@]}" --export type=nbd,id=e,node-name=r \
	-- --image r,file=q.qcow2,format=qcow2,read-only=on --nbd unix="$S",image=r
same r.raw --blockdev driver=raw,file.driver=file,file.filename=r.raw,node-name=r,offset=4096 \
	"${NBDS[@]}" --export type=nbd,id=e,node-name=r \
	-- --image r,file=r.raw,format=raw,offset=4096 --nbd unix="$S",image=r
same base.qcow2 --blockdev driver=qcow2,file.driver=file,file.filename=ovbq.qcow2,node-name=r \
	"${NBDS[@]}" --export type=nbd,id=e,node-name=r,writable=on \
	-- --image r,file=ovbq.qcow2,format=qcow2 --nbd unix="$S",image=r,writable=on
# With no export, nobody reads through the overlay: the raw backing file is shared as
# qemu-storage-daemon shares it.
same base.raw --blockdev driver=qcow2,file.driver=file,file.filename=ovr.qcow2,node-name=r \
	"${NBDS[@]}" -- --image r,file=ovr.qcow2,format=qcow2 --nbd unix="$S",image=x \
	--image x,driver=null,size=1M
# A raw backing file: qemu-storage-daemon lets others write and resize it under the
# overlay; ioplane does not (201, 203), as for any other backing file.
serve_bg io "$S" --image r,file=ovr.qcow2,format=qcow2 --nbd unix="$S",image=r,writable=on
[ "$(locks base.raw)" = "100 201 203" ] || fail "raw backing file: locks [$(locks base.raw)]"
refused "ioplane serves an overlay" qemu-io -f raw -c 'write 0 512' base.raw
refused "ioplane serves an overlay" qemu-img resize -f raw base.raw 2M
bg_stop "$BG_PID"

echo "== 3a. ioplane serves a qcow2 image writable"
fresh
serve_bg io "$S" --image d,file=q.qcow2,format=qcow2 --nbd unix="$S",image=d,writable=on
io=$BG_PID
what="ioplane serves it writable"
refused "$what" qemu-io -f qcow2 -c 'write -P 0x11 0 64k' q.qcow2
expect_grep "$ERR" 'Failed to get "write" lock'
refused "$what" qemu-img info q.qcow2
ok qemu-img info -U q.qcow2
refused "$what" qemu-storage-daemon --blockdev \
	driver=qcow2,file.driver=file,file.filename=q.qcow2,node-name=x
run_status 1 "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2 \
	--nbd unix="$T/second.sock",image=d,writable=on
expect_grep "$ERR" "Failed to get \"write\" lock: another process does not share \"write\""
expect_grep "$ERR" "other users hold: consistent read, write, resize; they do not share: write, resize"
expect_grep "$ERR" "Is another process using the image \\[q.qcow2\\]\\?"
! nbd_unix_listening "$T/second.sock" || fail "the refused server listens"
for cmd in "info q.qcow2" "check q.qcow2" "check -r all q.qcow2" "resize q.qcow2 2M" \
	"map q.qcow2" "convert -O raw q.qcow2 n.raw" "create -f qcow2 q.qcow2 1M"; do
	# shellcheck disable=SC2086
	refused "$what" "$IOPLANE" img $cmd
done
refused "$what" "$IOPLANE" bench -c 1 q.qcow2
ok "$IOPLANE" img info -U q.qcow2
expect_line "$OUT" "file format: qcow2"
ok "$IOPLANE" img convert -U -O raw q.qcow2 n.raw
nbd_qemu_io "$(nbd_uri d "$S")" "write -P 0x22 0 64k" >/dev/null
nbd_stop "$io"
[ -z "$(locks q.qcow2)" ] || fail "q.qcow2 still locked after serve stopped: $(locks q.qcow2)"
ok qemu-io -f qcow2 -c 'read -P 0x22 0 64k' q.qcow2
qcheck q.qcow2

echo "== 3b. qemu-storage-daemon and qemu-io hold the image"
fresh
qsd_bg qsd "$S" --blockdev driver=qcow2,file.driver=file,file.filename=q.qcow2,node-name=d \
	"${NBDS[@]}" --export type=nbd,id=e,node-name=d,writable=on
qsd=$BG_PID
what="qemu-storage-daemon serves it"
refused "$what" "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2 \
	--nbd unix="$T/second.sock",image=d,writable=on
refused "$what" "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2,read-only=on \
	--nbd unix="$T/second.sock",image=d
for cmd in "info q.qcow2" "check -r all q.qcow2" "resize q.qcow2 2M" "compare q.qcow2 o.raw" \
	"convert -O raw q.qcow2 n.raw"; do
	# shellcheck disable=SC2086
	refused "$what" "$IOPLANE" img $cmd
done
refused "$what" "$IOPLANE" bench -c 1 q.qcow2
ok "$IOPLANE" bench -U -c 1 q.qcow2
ok "$IOPLANE" img check -U q.qcow2
ok "$IOPLANE" img map -U q.qcow2
# locking=off: the file is not locked and other locks are not looked at.
serve_bg off "$T/off.sock" --image d,file=q.qcow2,format=qcow2,read-only=on,locking=off \
	--nbd unix="$T/off.sock",image=d
bg_stop "$BG_PID"
bg_stop "$qsd"
bg_start qio qemu-io -f qcow2 -c 'sleep 100000' q.qcow2
qio=$BG_PID
wait_locks q.qcow2
refused "qemu-io has it open" "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2 \
	--nbd unix="$T/second.sock",image=d,writable=on
refused "qemu-io has it open" "$IOPLANE" img info q.qcow2
bg_stop "$qio"

echo "== 3c. readers coexist; raw images may have several writers, qcow2 one"
fresh
serve_bg ro1 "$T/ro1.sock" --image d,file=q.qcow2,format=qcow2,read-only=on \
	--nbd unix="$T/ro1.sock",image=d
ro1=$BG_PID
serve_bg ro2 "$T/ro2.sock" --image d,file=q.qcow2,format=qcow2,read-only=on \
	--nbd unix="$T/ro2.sock",image=d
ro2=$BG_PID
qsd_bg qsdro "$T/ro3.sock" --blockdev \
	driver=qcow2,file.driver=file,file.filename=q.qcow2,node-name=d,read-only=on \
	--nbd-server addr.type=unix,addr.path="$T/ro3.sock" --export type=nbd,id=e,node-name=d
qsdro=$BG_PID
ok qemu-img info q.qcow2
ok qemu-io -r -f qcow2 -c 'read 0 4k' q.qcow2
ok "$IOPLANE" img info q.qcow2
ok "$IOPLANE" img compare q.qcow2 q.qcow2
refused "readers do not share write" qemu-io -f qcow2 -c 'write 0 4k' q.qcow2
refused "readers do not share write" "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2 \
	--nbd unix="$T/second.sock",image=d
bg_stop "$ro1"
bg_stop "$ro2"
bg_stop "$qsdro"
serve_bg w1 "$T/w1.sock" --image d,file=r.raw,format=raw --nbd unix="$T/w1.sock",image=d,writable=on
w1=$BG_PID
serve_bg w2 "$T/w2.sock" --image d,file=r.raw,format=raw --nbd unix="$T/w2.sock",image=d,writable=on
w2=$BG_PID
qsd_bg w3 "$T/w3.sock" --blockdev driver=raw,file.driver=file,file.filename=r.raw,node-name=d \
	--nbd-server addr.type=unix,addr.path="$T/w3.sock" --export type=nbd,id=e,node-name=d,writable=on
bg_stop "$BG_PID"
refused "NBD exports do not share resize" "$IOPLANE" img resize -f raw r.raw 2M
bg_stop "$w1"
bg_stop "$w2"

echo "== 3d. backing and data files"
fresh
serve_bg ov "$S" --image d,file=ovbq.qcow2,format=qcow2,read-only=on --nbd unix="$S",image=d
refused "it is a backing file in use" qemu-io -f qcow2 -c 'write 0 4k' base.qcow2
refused "it is a backing file in use" "$IOPLANE" img resize base.qcow2 2M
bg_stop "$BG_PID"
serve_bg ext "$S" --image d,file=ext.qcow2,format=qcow2 --nbd unix="$S",image=d,writable=on
refused "it is a data file in use" qemu-img resize -f raw ext.data 2M
refused "it is a data file in use" "$IOPLANE" img resize -f raw ext.data 2M
refused "it is a data file in use" "$IOPLANE" img create -f raw ext.data 1M
bg_stop "$BG_PID"
ok qemu-img resize -f raw ext.data 2M

echo "== 3e. locking=off"
fresh
serve_bg off "$S" --image d,file=q.qcow2,format=qcow2,locking=off --nbd unix="$S",image=d,writable=on
[ -z "$(locks q.qcow2)" ] || fail "locking=off locks: $(locks q.qcow2)"
ok qemu-img info q.qcow2
bg_stop "$BG_PID"
run_status 1 "$IOPLANE" serve --image d,file=q.qcow2,format=qcow2,locking=sometimes \
	--nbd unix="$S",image=d
expect_grep "$ERR" "locking must be on, off or auto"
echo "PASS"
