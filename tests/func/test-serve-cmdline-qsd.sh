#!/bin/bash
# Bad command lines of `ioplane serve` next to qemu-storage-daemon's with the same meaning
# (an unknown option, a missing argument, an operand, a bad key or value, an image or a
# socket that cannot be opened, for NBD and vhost-user-blk alike): both exit 1 before
# serving anything, and ioplane says why in one line on stderr naming WORD, with nothing on
# stdout and nothing left listening. Then the top-level and `img` dispatch, as qemu-img.
. "$(dirname "$0")/lib.sh"
need qemu-storage-daemon qemu-img

T=$FUNC_TMP
cd "$T"
truncate -s 1M r.raw
N=d,driver=null,size=1M
QN="--blockdev driver=null-co,node-name=d"
QNBD="--nbd-server addr.type=unix,addr.path=$T/s"

# pair WORD "IOPLANE SERVE ARGS" "QSD ARGS": the same exit status (1), and ioplane's one
# line matches WORD (an ERE). The arguments are split on blanks.
npairs=0
pair() {
	local word=$1 rc=0 qrc=0
	# shellcheck disable=SC2086
	timeout 10 qemu-storage-daemon $3 </dev/null >q.out 2>q.err || qrc=$?
	[ "$qrc" -eq 1 ] || fail "qemu-storage-daemon $3: exit $qrc: $(cat q.err)"
	rm -f s v
	# shellcheck disable=SC2086
	timeout 10 "$IOPLANE" serve $2 </dev/null >i.out 2>i.err || rc=$?
	[ "$rc" -eq "$qrc" ] || fail "serve $2: exit $rc, qemu-storage-daemon $qrc: $(cat i.err)"
	[ ! -s i.out ] || fail "serve $2: stdout: $(cat i.out)"
	[ "$(grep -c . i.err)" -eq 1 ] || fail "serve $2: not one line on stderr: $(cat i.err)"
	grep -qE -- "$word" i.err || fail "serve $2: the message does not name /$word/: $(cat i.err)"
	[ ! -S s ] && [ ! -S v ] || fail "serve $2: left a socket"
	npairs=$((npairs + 1))
}

pair "'--bogus'" "--bogus" "--bogus"
pair "'-Z'" "-Z" "-Z"
pair "--image" "--image" "--blockdev"
pair "extra" "extra" "extra"
pair "bogus" "--image d,driver=bogus --nbd unix=$T/s,image=d" "--blockdev driver=bogus,node-name=d"
pair "missing\.img.*No such file or directory" \
	"--image d,file=missing.img,format=raw --nbd unix=$T/s,image=d" \
	"--blockdev driver=file,filename=missing.img,node-name=d"
pair "qcow2" "--image d,file=r.raw,format=qcow2 --nbd unix=$T/s,image=d" \
	"--blockdev driver=qcow2,file.driver=file,file.filename=r.raw,node-name=d"
pair "--image.*d" "--image $N --image $N --nbd unix=$T/s,image=d" "$QN $QN"
pair "nope" "--image $N --nbd unix=$T/s,image=nope" \
	"$QN $QNBD --export type=nbd,id=e,node-name=nope"
pair "writable" "--image $N --nbd unix=$T/s,image=d,writable=maybe" \
	"$QN $QNBD --export type=nbd,id=e,node-name=d,writable=maybe"
pair "read-only" "--image $N,read-only=on --nbd unix=$T/s,image=d,writable=on" \
	"$QN,read-only=on $QNBD --export type=nbd,id=e,node-name=d,writable=on"
QV="--export type=vhost-user-blk,id=e,addr.type=unix,addr.path=$T/v"
pair "nope" "--image $N --vhost-user-blk unix=$T/v,image=nope" "$QN $QV,node-name=nope"
pair "num-queues" "--image $N --vhost-user-blk unix=$T/v,image=d,num-queues=0" \
	"$QN $QV,node-name=d,num-queues=0"
pair "nodir/p.*No such file or directory" \
	"--pidfile $T/nodir/p --image $N --nbd unix=$T/s,image=d" "--pidfile $T/nodir/p $QN $QNBD"
pair "nodir/m.*No such file or directory" "--image $N --monitor unix=$T/nodir/m" \
	"--chardev socket,id=m,path=$T/nodir/m,server=on,wait=off --monitor chardev=m"

# A socket in a directory that does not exist: the same exit status and the same message
# for both kinds of export (qemu-storage-daemon too says the same for both).
pair "nodir/s.*No such file or directory" "--image $N --nbd unix=$T/nodir/s,image=d" \
	"$QN --nbd-server addr.type=unix,addr.path=$T/nodir/s"
sed "s|nodir/s|nodir/X|g" i.err >nbd.msg
sed "s|nodir/s|nodir/X|g" q.err | sed 's/^[^:]*: [^:]*: //' >qnbd.msg
pair "nodir/v.*No such file or directory" "--image $N --vhost-user-blk unix=$T/nodir/v,image=d" \
	"$QN --export type=vhost-user-blk,id=e,node-name=d,addr.type=unix,addr.path=$T/nodir/v"
sed "s|nodir/v|nodir/X|g" i.err >vhost.msg
sed "s|nodir/v|nodir/X|g" q.err | sed 's/^[^:]*: [^:]*: //' >qvhost.msg
diff -u qnbd.msg qvhost.msg || fail "qemu-storage-daemon's messages differ (test bug?)"
diff -u nbd.msg vhost.msg || fail "a missing directory: NBD and vhost-user-blk say it differently"
echo "$npairs bad serve command lines: exit 1 as in qemu-storage-daemon"

# The dispatch: an unknown or missing (img) command is a bad command line, exit 1 as in
# qemu-img, with one line on stderr.
for args in "nosuch" "" "img nosuch" "img"; do
	rc=0
	# shellcheck disable=SC2086
	"$IOPLANE" $args >i.out 2>i.err || rc=$?
	qrc=0
	# the qemu-img form of the same: `img` is the qemu-img executable
	# shellcheck disable=SC2086
	qemu-img ${args#img} >q.out 2>/dev/null || qrc=$?
	[ "$qrc" -eq 1 ] || fail "qemu-img ${args#img}: exit $qrc (test bug?)"
	[ "$rc" -eq 1 ] || fail "ioplane $args: exit $rc, qemu-img says $qrc"
	[ "$(grep -c . i.err)" -eq 1 ] || fail "ioplane $args: not one line on stderr: $(cat i.err)"
	[ ! -s i.out ] || fail "ioplane $args: stdout: $(cat i.out)"
done
echo "unknown and missing commands: exit 1 as in qemu-img"
