#!/bin/bash
# `ioplane serve` command line: --help lists every option and key with examples (exit 0);
# each bad argument gets exactly one line on stderr and exit status 1 (as in
# qemu-storage-daemon), promptly, with no socket left listening; an image that cannot be
# opened fails start-up with a message.
. "$(dirname "$0")/nbd-lib.sh"

[ -z "$NBD_TEST_PEER" ] || skip "the command line is ioplane's own"
nbd_need_ioplane

sock=$NBD_TMP/nbd.sock
img=$NBD_TMP/disk.img
truncate -s 1M "$img"

# --help: exit 0, on stdout, mentions every documented option form.
out=$(timeout 10 "$IOPLANE" serve --help 2>"$NBD_TMP/help.err") ||
	fail "serve --help: exit status $?"
echo "$out"
for w in --iothreads --pidfile --max-connections --max-request-memory --poll-max-ns --image \
	--nbd file= format=raw cache=none writeback aio=io_uring native threads read-only=on discard=unmap ignore \
	detect-zeroes= driver=null size= latency-ns= read-zeroes= unix= tcp= image= name= \
	writable=on description= format=qcow2 backing= backing-format= data-file= l2-cache-size= \
	--vhost-user-blk --metrics --log-file --run-with user= group= public=on; do
	grep -qF -- "$w" <<<"$out" || fail "serve --help does not mention '$w'"
done
grep -qi example <<<"$out" || fail "serve --help has no examples"
[ "$(grep -c 'ioplane serve' <<<"$out")" -ge 2 ] || fail "serve --help: fewer than 2 examples"

# bad STATUS WORD ARGS...: exactly one line on stderr, naming the culprit (WORD: an ERE), exit
# STATUS, promptly, and no listener left behind. STATUS "any": non-zero, any message size.
bad() {
	local want=$1 word=$2 rc=0 n
	shift 2
	timeout 10 "$IOPLANE" serve "$@" >"$NBD_TMP/out" 2>"$NBD_TMP/err" </dev/null || rc=$?
	[ $rc -ne 124 ] || fail "serve $*: still running after 10s"
	n=$(grep -c . "$NBD_TMP/err" || true)
	echo "serve $* -> $rc: $(head -n 3 "$NBD_TMP/err")"
	if [ "$want" = any ]; then
		[ $rc -ne 0 ] || fail "serve $*: exit 0"
	else
		[ $rc -eq "$want" ] || fail "serve $*: exit $rc, expected $want"
		[ "$n" -eq 1 ] || fail "serve $*: $n lines on stderr, expected one"
	fi
	grep -qiE -- "$word" "$NBD_TMP/err" || fail "serve $*: the message does not name /$word/"
	! nbd_unix_listening "$sock" || fail "serve $*: socket left listening"
}

N=d0,driver=null,size=1G
E=unix=$sock,image=d0
F=d0,file=$img
bad 1 --bogus --bogus
bad 1 --iothreads --iothreads
bad 1 abc --iothreads abc --image $N --nbd "$E"
bad 1 -1 --iothreads -1 --image $N --nbd "$E"
bad 1 -1 --max-connections -1 --image $N --nbd "$E"
bad 1 "lots|max-connections" --max-connections lots --image $N --nbd "$E"
bad 1 "lots|max-request-memory" --max-request-memory lots --image $N --nbd "$E"
bad 1 "10K|max-request-memory" --max-request-memory 10K --image $N --nbd "$E"
bad 1 "soon|poll-max-ns" --poll-max-ns soon --image $N --nbd "$E"
bad 1 "-5|poll-max-ns" --poll-max-ns -5 --image $N --nbd "$E"
bad 1 "99000000000|poll-max-ns" --poll-max-ns 99000000000 --image $N --nbd "$E"
bad 1 --image --image
bad 1 size --image d0,driver=null --nbd "$E"
bad 1 "12Q|size" --image d0,driver=null,size=12Q --nbd "$E"
bad 1 floppy --image d0,driver=floppy,size=1G --nbd "$E"
bad 1 colour --image "$N,colour=blue" --nbd "$E"
bad 1 "soon|latency-ns" --image "$N,latency-ns=soon" --nbd "$E"
bad 1 "perhaps|read-zeroes" --image "$N,read-zeroes=perhaps" --nbd "$E"
bad 1 d0 --image $N --image d0,driver=null,size=2G --nbd "$E"
bad 1 "sometimes|cache" --image "$F,cache=sometimes" --nbd "$E"
bad 1 "fast|aio" --image "$F,aio=fast" --nbd "$E"
bad 1 "bogus|format" --image "$F,format=bogus" --nbd "$E"
bad 1 "maybe|discard" --image "$F,discard=maybe" --nbd "$E"
bad 1 "maybe|detect-zeroes" --image "$F,detect-zeroes=maybe" --nbd "$E"
bad 1 "sometimes|read-only" --image "$F,read-only=sometimes" --nbd "$E"
bad 1 nosuch --image $N --nbd "unix=$sock,image=nosuch"
bad 1 "unix|tcp" --image $N --nbd image=d0
bad 1 image --image $N --nbd "unix=$sock"
bad 1 "maybe|writable" --image $N --nbd "$E,writable=maybe"
bad 1 colour --image $N --nbd "$E,colour=blue"
bad 1 99999 --image $N --nbd tcp=127.0.0.1:99999,image=d0
bad 1 127.0.0.1 --image $N --nbd tcp=127.0.0.1,image=d0
bad 1 port --image $N --nbd tcp=127.0.0.1:port,image=d0
bad 1 d0 --image $N --nbd "$E" --nbd "$E"
bad 1 stray --image $N --nbd "$E" stray-argument
bad 1 no-such-user --image $N --nbd "$E,user=no-such-user"
bad 1 no-such-group --image $N --nbd "$E,group=no-such-group"
bad 1 'user=' --image $N --nbd "$E" --run-with nobody
bad 1 'not a loopback' --image $N --nbd "$E" --metrics tcp=192.0.2.1:9100
bad 1 'given twice' --image $N --nbd "$E" --metrics unix=$NBD_TMP/m1 --metrics unix=$NBD_TMP/m2
bad 1 bogus --image $N --nbd "$E" --metrics unix=$NBD_TMP/m1,bogus=1
bad 1 'log-file' --image $N --nbd "$E" --log-file /nonexistent-dir/x.log
# Not a syntax error, but start-up must fail cleanly with a message naming the file.
bad any does-not-exist --image d0,file="$NBD_TMP/does-not-exist.img" --nbd "$E"

# A good command line still works after all that (the checks above were not vacuous).
nbd_serve --image $N --nbd "$E"
nbd_stop
# Polling off and a custom limit are accepted and serve.
for p in 0 100000; do
	nbd_serve --poll-max-ns $p --image $N --nbd "$E"
	nbdinfo --size "nbd+unix:///d0?socket=$sock" | grep -qx 1073741824 ||
		fail "serve --poll-max-ns $p: the export does not answer"
	nbd_stop
done
echo PASS
