#!/bin/bash
# A first look at ioplane: install what it needs (scripts/deps.sh main), build
# build/, make a 256 MiB raw image in demo/, and run `ioplane bench` with 4 KiB
# random reads at queue depth 64 through each I/O engine (io_uring, linux-aio,
# thread pool), then against the null driver to show the per-request cost of
# ioplane itself; then serves the image over NBD (`ioplane serve`) until Ctrl-C
# and prints how to connect. Run as root on Debian 12 for the packages.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$src"
exec </dev/null

IMG=demo/demo.raw
IMG_SIZE=$((256 << 20))
COUNT=${DEMO_COUNT:-200000} # requests per run; a few seconds on an SSD
BENCH=build/ioplane

step() {
	printf '\n==> %s\n' "$*"
}

step "checking packages"
bash scripts/deps.sh main

step "building build/"
if [ -f build/meson-private/coredata.dat ]; then
	meson setup --reconfigure build -Db_sanitize=none >/dev/null
else
	meson setup build >/dev/null
fi
ninja -C build ioplane

# O_DIRECT (-t none) is what a VM disk uses; tmpfs and some overlays lack it.
cache_mode() {
	if dd if="$IMG" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
		echo none
	else
		echo "demo.sh: O_DIRECT is not supported here; using -t writeback" >&2
		echo writeback
	fi
}

# Fill the image with real data: reads of a sparse file never reach the disk
# and would flatter every engine alike. demo/.filled marks a finished fill.
make_image() {
	local size
	size=$(stat -c %s "$IMG" 2>/dev/null || echo 0)
	if [ "$size" -eq "$IMG_SIZE" ] && [ -f demo/.filled ]; then
		return
	fi
	step "creating $IMG (256 MiB)"
	mkdir -p demo
	rm -f demo/.filled
	truncate -s 0 "$IMG"
	truncate -s "$IMG_SIZE" "$IMG"
	# Sequential bench offsets wrap before the last buffer of the image (modulo
	# size - buffer size, as qemu-img bench's do), so 255 writes of 1 MiB from 0
	# and one that starts at the last MiB cover it all. The blocks check catches
	# a bench that exits 0 without writing.
	local fill=(bench -w -f raw -t "$cache" -i io_uring -s 1M --pattern=165 -q)
	if ! "$BENCH" "${fill[@]}" -d 16 -c $((IMG_SIZE / (1 << 20) - 1)) "$IMG" ||
		! "$BENCH" "${fill[@]}" -c 1 -o $((IMG_SIZE - (1 << 20))) "$IMG" ||
		[ $(($(stat -c '%b * %B' "$IMG"))) -lt "$IMG_SIZE" ]; then
		echo "demo.sh: 'ioplane bench -w' did not fill the image; using dd instead" >&2
		dd if=/dev/urandom of="$IMG" bs=1M count=256 conv=notrunc,fsync status=none
	fi
	touch demo/.filled
}

# run TITLE ARGS...: one benchmark run; a failure is reported, not fatal.
run() {
	local title=$1
	shift
	step "$title"
	echo "\$ $BENCH bench $*"
	local rc=0
	"$BENCH" bench "$@" || rc=$?
	if [ $rc -ne 0 ]; then
		echo "demo.sh: this run failed (exit $rc)" >&2
		failed=$((failed + 1))
	fi
}

mkdir -p demo
[ -e "$IMG" ] || truncate -s "$IMG_SIZE" "$IMG"
cache=$(cache_mode)
make_image
failed=0
common=(-d 64 -s 4K --random -c "$COUNT")

run "io_uring engine: 4 KiB random reads, depth 64" \
	"${common[@]}" -f raw -t "$cache" -i io_uring "$IMG"
run "linux-aio engine: 4 KiB random reads, depth 64" \
	"${common[@]}" -f raw -t "$cache" -i native "$IMG"
run "thread-pool engine: 4 KiB random reads, depth 64" \
	"${common[@]}" -f raw -t "$cache" -i threads "$IMG"
run "null driver (no I/O: the cost of ioplane itself)" \
	-d 64 -s 4K --random -c $((COUNT * 5)) null:size=1G

echo
if [ $failed -gt 0 ]; then
	echo "demo.sh: $failed run(s) failed"
	exit 1
fi

# The daemon: serve the demo image over NBD on a unix socket (0600) in the
# foreground until Ctrl-C or SIGTERM. DEMO_SERVE_SECONDS=N stops it after N
# seconds (0: do not serve).
sock=$src/demo/nbd.sock
serve_for=${DEMO_SERVE_SECONDS:-}
[ "$serve_for" = 0 ] && exit 0
step "serving $IMG over NBD"
cat <<EOF
Connect from another shell, for example:
  nbdinfo 'nbd+unix:///demo?socket=$sock'
  qemu-img info 'nbd+unix:///demo?socket=$sock'
  qemu-io -f raw -c 'read -v 0 512' 'nbd+unix:///demo?socket=$sock'
  qemu-img convert -p -O qcow2 'nbd+unix:///demo?socket=$sock' /tmp/copy.qcow2
Stop with Ctrl-C.
EOF
serve=("$BENCH" serve --image "demo,file=$IMG,format=raw,cache=$cache"
	--nbd "unix=$sock,image=demo,writable=on,description=ioplane demo image")
if [ -n "$serve_for" ]; then
	exec timeout --preserve-status -s TERM "$serve_for" "${serve[@]}"
fi
exec "${serve[@]}"
