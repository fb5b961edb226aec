#!/bin/bash
# Bad command lines of every `ioplane img` subcommand, next to qemu-img's: an unknown
# option, a missing option argument, a bad option value and the wrong number of operands
# exit with qemu-img's status (1, as the man page says; compare's -T is an open failure,
# 2, in both), print one line on stderr saying why, and print nothing on stdout.
# --help exits 0 with the usage on stdout.
. "$(dirname "$0")/img-lib.sh"

qemu-img create -q -f qcow2 a.qcow2 1M
qemu-img create -q -f qcow2 b.qcow2 1M

# bad ARGS...: ioplane img and qemu-img both refuse ARGS with the same exit status; ours
# says so in one line on stderr, prints nothing on stdout and makes no image (qemu-img
# convert makes its target before it looks at -t and -T).
nbad=0
bad() {
	local rc=0 want
	qemu-img "$@" >q.out 2>q.err || rc=$?
	want=$rc
	[ "$want" -ne 0 ] || fail "qemu-img $* succeeded: the case is wrong"
	rm -f x.qcow2 x.raw c.qcow2
	img_status "$want" "$@"
	[ ! -s "$OUT" ] || fail "img $*: stdout: $(cat "$OUT")"
	[ "$(grep -c . "$ERR")" -eq 1 ] || fail "img $*: not one line on stderr: $(cat "$ERR")"
	[ ! -e x.qcow2 ] && [ ! -e x.raw ] && [ ! -e c.qcow2 ] || fail "img $*: made an image"
	nbad=$((nbad + 1))
}

for c in create info check map convert compare resize; do
	bad "$c" --bogus-option a.qcow2
	bad "$c" -Z a.qcow2
	bad "$c" -f
	bad "$c"
	img "$c" --help
	expect_grep "$OUT" "^Usage: ioplane img $c "
done

bad create -f qcow2 x.qcow2 1M extra
bad create -f qcow2 x.qcow2 10Q
bad create -f qcow2 -o size=10Q x.qcow2
bad info a.qcow2 b.qcow2
bad info --output=xml a.qcow2
bad check -r bogus a.qcow2
bad check -T bogus a.qcow2
bad check --output=xml a.qcow2
bad check a.qcow2 b.qcow2
bad map --output=xml a.qcow2
bad map --start-offset=-1 a.qcow2
bad map --max-length=10Q a.qcow2
bad map a.qcow2 b.qcow2
bad convert -m 0 a.qcow2 c.qcow2
bad convert -S 10Q a.qcow2 c.qcow2
bad convert -S 1000 a.qcow2 c.qcow2
bad convert -t bogus a.qcow2 c.qcow2
bad convert -T bogus a.qcow2 c.qcow2
bad convert a.qcow2
bad compare a.qcow2
bad compare a.qcow2 b.qcow2 c.qcow2
bad compare -T bogus a.qcow2 b.qcow2
bad resize a.qcow2
bad resize a.qcow2 10Q
bad resize a.qcow2 +-1

# Messages that name what is wrong, in qemu-img's words.
img_status 1 map --start-offset=1x a.qcow2
expect_grep "$ERR" "Invalid start offset specified\. You may use k, M, G, T, P or E suffixes"
img_status 1 map --max-length=16E a.qcow2
expect_grep "$ERR" "Invalid max length specified\. Must be between 0 and 9223372036854775807\."
img_status 1 create -f qcow2 x.qcow2 10Q
expect_grep "$ERR" "Invalid image size specified\. You may use k, M, G, T, P or E suffixes"
img_status 1 create -f raw -o size=10Q x.raw
expect_grep "$ERR" "x\.raw: Parameter 'size' expects a non-negative number below 2\^64"
img_status 1 resize a.qcow2 16E
expect_grep "$ERR" "Value '16E' is out of range for parameter 'size'"
img_status 1 check -T bogus a.qcow2
expect_grep "$ERR" "Invalid source cache option: bogus"
echo "$nbad bad command lines: the same exit status as qemu-img's"

# Sizes read as qemu-img reads them: create's "Formatting" line (the size it took) and exit
# status are qemu-img's for each form. qemu-img takes the fraction through a double, so
# past about 17 digits it rounds: ioplane computes it exactly (cases at the end).
nsizes=0
for s in 1 512 00012 1k 1K 1m 1M 1g 1G 1T 1P 1E 7E 8E 16E 1b 1B 1KB 1KiB 1.5G 1.5 0.5k \
	1.1k 1.0001k 1.0005k 1.0004k 1.00048828125k 1.25k 1.0 1.00k 1. 1.k 5.e 1.5e 1.5e3 1.e3 \
	.5k 0x1000 0x1k 0x1.8k 0x 00x1 1e3 +1 ' 1' '	+2k' '1 ' '+ 2k' 1Q 10Q 2kb 1.5b \
	99999999999999999999 99999999999999999999k 18446744073709551615 9223372036854775807 \
	9223372036854775808 17179869184G 0x10000000000000000 1.5E 8EB 0.5 ''; do
	rm -f q.raw i.raw
	qrc=0
	qemu-img create -f raw q.raw "$s" >q.out 2>/dev/null || qrc=$?
	img_status "$qrc" create -f raw i.raw "$s"
	diff -u <(sed 's/q\.raw/F/' q.out) <(sed 's/i\.raw/F/' "$OUT") ||
		fail "create size '$s': not what qemu-img made of it"
	nsizes=$((nsizes + 1))
done
for c in "1.999999999999999999999999999G 2147483648" "1.99999999999999999999M 2097152" \
	"0.9999999999999999999999999999k 1024"; do
	set -- $c
	img create -f raw i.raw "$1"
	expect_line "$OUT" "Formatting 'i.raw', fmt=raw size=$2"
done
img_status 1 create -f raw i.raw 1.0000000000000000000001
echo "$nsizes sizes read as qemu-img reads them"
# The other size and number options, next to qemu-img's: bench's -s, -S and -o (its
# "Sending" line and exit status), create's -o cluster_size= and extent_size_hint= (sizes)
# and refcount_bits= (a number: base 0, no suffix), their Formatting line and exit status.
truncate -s 1M r.raw
# same_as_qemu STDOUT_LINES ARGS...: ioplane ARGS and qemu-img ARGS exit alike and print
# the same first STDOUT_LINES lines, the image's name aside.
same_as_qemu() {
	local lines=$1 qrc=0
	shift
	rm -f q.img i.img
	qemu-img "${@//@/q.img}" >q.out 2>/dev/null || qrc=$?
	img_status "$qrc" "${@//@/i.img}"
	diff -u <(head -n "$lines" q.out | sed 's/q\.img/F/') \
		<(head -n "$lines" "$OUT" | sed 's/i\.img/F/') || fail "$*: not what qemu-img does"
	nsizes=$((nsizes + 1))
}
for s in 4k 1.1k 0x1000 ' 4k' +4k 4096b 4KiB 1e3 10Q -1 '' 0.5k 2G 0x1k 1.0000001k; do
	same_as_qemu 1 bench -f raw -c 1 -s "$s" r.raw
	same_as_qemu 1 bench -f raw -c 2 -S "$s" r.raw
	same_as_qemu 1 bench -f raw -c 1 -o "$s" r.raw
done
for o in cluster_size=0x10000 "cluster_size= 64k" cluster_size=+64k cluster_size=0.5M \
	cluster_size=65536b cluster_size=1.5k cluster_size=bad cluster_size=99999999999999999999 \
	refcount_bits=0x10 refcount_bits=020 "refcount_bits= 8" refcount_bits=+16 refcount_bits=1k \
	refcount_bits=16.0 refcount_bits= refcount_bits=99999999999999999999; do
	same_as_qemu 1 create -f qcow2 -o "$o" @ 1M
done
for o in extent_size_hint=1M extent_size_hint=0x100000 extent_size_hint=0.5M \
	extent_size_hint=+1M extent_size_hint=10Q extent_size_hint=0 \
	extent_size_hint=1M,preallocation=falloc; do
	same_as_qemu 1 create -f raw -o "$o" @ 1M
done
img_status 1 create -f qcow2 -o refcount_bits=1k x.qcow2 1M
expect_grep "$ERR" "x\.qcow2: Parameter 'refcount_bits' expects a number$"
img_status 1 create -f raw -o extent_size_hint=10Q x.raw 1M
expect_grep "$ERR" "x\.raw: Parameter 'extent_size_hint' expects a non-negative number"
echo "$nsizes sizes and numbers read as qemu-img reads them"
# -o size= too, and the drivers get the number qemu-img would.
img create -f qcow2 -o size=1.1k q.qcow2
expect_grep "$OUT" " size=1126 "
qemu-img info q.qcow2 | grep -qF "(1536 bytes)" || fail "-o size=1.1k: not a 1126-byte image"

# The null driver's size=: a bad one is said to be bad, a missing one missing (img, bench
# and serve open it alike).
img_status 1 info null:size=10Q
expect_grep "$ERR" "null: bad size '10Q'"
img_status 1 info null:read-zeroes=on
expect_grep "$ERR" "null: option size=SIZE is required"
run_status 1 "$IOPLANE" bench -c 1 null:size=1x
expect_grep "$ERR" "null: bad size '1x'"
