#!/bin/bash
# Install the Debian 12 packages ioplane needs, if any are missing.
#   scripts/deps.sh main   build and run: compiler, meson, liburing, libaio, jansson, gnutls, qemu-img
#   scripts/deps.sh test   main plus everything the test suite drives
# Quiet when nothing is missing; runs apt-get (as root, no prompts) otherwise.
set -euo pipefail

main_pkgs=(gcc pkg-config meson ninja-build liburing-dev libaio-dev zlib1g-dev libzstd-dev
	libjansson-dev libnbd-dev librbd-dev libgnutls28-dev qemu-utils systemtap-sdt-dev)
test_pkgs=(libcmocka-dev fio valgrind strace python3 nbdkit libnbd-bin clang clang-format-14
	libclang-rt-14-dev qemu-system-x86 busybox-static cpio xfsprogs ceph-mon ceph-osd ceph-common
	python3-rados qemu-block-extra gnutls-bin bpftrace python3-libnbd prometheus curl)

usage() {
	echo "usage: $0 main|test" >&2
	exit 2
}

[ $# -eq 1 ] || usage
case "$1" in
main) want=("${main_pkgs[@]}") ;;
test) want=("${main_pkgs[@]}" "${test_pkgs[@]}") ;;
*) usage ;;
esac

installed() {
	dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed
}

missing=()
for p in "${want[@]}"; do
	installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps.sh: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null; then
		sudo=(sudo -n)
	else
		echo "deps.sh: missing packages and not root: ${missing[*]}" >&2
		exit 1
	fi
else
	sudo=()
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q </dev/null
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	"${missing[@]}" </dev/null
