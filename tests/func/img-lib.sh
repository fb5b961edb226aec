# Helpers for the `ioplane img` functional tests (tests/func/test-img-*.sh and
# test-qcow2-crash.sh), sourced on top of lib.sh: run the tool, check images with qemu-img
# (the authority on qcow2), make patterned raw files. Plain bash, one test process.
# Exit codes follow the runner: 0 pass, 77 skip (reason last), else fail.

IMG_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
[ -n "${FUNC_TMP:-}" ] || . "$IMG_LIB_DIR/lib.sh" # nbd-lib.sh may have sourced it
need qemu-img qemu-io python3 cmp
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR

T=$FUNC_TMP
cd "$T"

# img ARGS...: `ioplane img ARGS` must succeed (stdout in $OUT, stderr in $ERR).
img() { run_ok "$IOPLANE" img "$@"; }

# img_status WANT ARGS...: `ioplane img ARGS` must exit with WANT.
img_status() {
	local want=$1
	shift
	run_status "$want" "$IOPLANE" img "$@"
}

# qcheck FILE: qemu-img check finds no corruption, no leak, no internal error.
qcheck() {
	local out rc=0
	out=$(qemu-img check --output=json "$1" 2>&1) || rc=$?
	if [ $rc -ne 0 ] || grep -qE '"(corruptions|leaks|check-errors)": [1-9]' <<<"$out"; then
		echo "$out" >&2
		fail "qemu-img check $1: exit $rc"
	fi
}

# qcheck_no_corruption FILE: no corruption or internal error (leaks allowed); echoes leaks.
qcheck_no_corruption() {
	local out rc=0
	out=$(qemu-img check --output=json "$1" 2>/dev/null) || rc=$?
	if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
		qemu-img check "$1" >&2 || true
		fail "qemu-img check $1: exit $rc (corruption or check error)"
	fi
	python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("leaks", 0))' "$out"
}

# qinfo IMAGE KEY: a top-level field of `qemu-img info --output=json IMAGE`.
qinfo() {
	qemu-img info --output=json "$1" |
		python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

# qcheck_get IMAGE KEY: a field of `qemu-img check --output=json IMAGE` (0 when absent).
qcheck_get() {
	{ qemu-img check --output=json "$1" 2>/dev/null || true; } |
		python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], 0))' "$2"
}

# workload IMAGE SEED CLUSTER [_imgwork.py options]: random qemu-io commands on a qcow2
# IMAGE, in one qemu-io run; every command must succeed.
workload() {
	local f=$1 seed=$2 cs=$3 c out
	shift 3
	local -a args=()
	while read -r c; do
		args+=(-c "$c")
	done < <(python3 "$IMG_LIB_DIR/_imgwork.py" qemu-io "$seed" "$(qinfo "$f" virtual-size)" \
		"$cs" "$@")
	out=$(qemu-io -f qcow2 "${args[@]}" "$f" 2>&1) || fail "qemu-io on $f: $out"
	! grep -qiE 'fail|error' <<<"$out" ||
		fail "qemu-io on $f: $(grep -iE 'fail|error' <<<"$out")"
}

# qsame A B: qemu-img compare says the guest sees the same bytes (formats probed by
# qemu-img; only ever used on images made by the test).
qsame() {
	qemu-img compare -q "$1" "$2" || fail "qemu-img compare $1 $2: images differ"
}

# pattern_raw FILE SIZE SEED: a raw file with data runs, zero runs and holes, from SEED.
pattern_raw() {
	python3 - "$1" "$2" "$3" <<'PY'
import random, sys
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
with open(path, 'wb') as f:
    f.truncate(size)
    off = 0
    while off < size:
        n = min(size - off, r.choice([512, 4096, 65536, 200000, 1 << 20]))
        kind = r.random()
        if kind < 0.5:
            f.seek(off)
            f.write(bytes([r.randrange(1, 256)]) * n if r.random() < 0.5 else r.randbytes(n))
        elif kind < 0.6:
            f.seek(off)
            f.write(bytes(n))  # allocated zeroes
        off += n
PY
}

# ioplane_raw IMAGE OUT: the guest view of IMAGE through ioplane, as a raw file.
ioplane_raw() {
	rm -f "$2"
	img convert -O raw "$1" "$2"
}

# qemu_raw IMAGE OUT: the same through qemu-img.
qemu_raw() {
	rm -f "$2"
	qemu-img convert -O raw "$1" "$2"
}

# same_as_qemu IMAGE: ioplane and qemu-img read IMAGE the same, byte for byte.
same_as_qemu() {
	ioplane_raw "$1" "$1.io.raw"
	qemu_raw "$1" "$1.q.raw"
	cmp "$1.io.raw" "$1.q.raw" || fail "$1: ioplane reads other bytes than qemu-img"
	rm -f "$1.io.raw" "$1.q.raw"
}
