# The golden-output cases of `ioplane img` (info, check, map) on the fixed images in this
# directory, shared by make-images.sh (which records qemu-img's output as the expected one)
# and tests/func/test-img-golden.sh (which checks ioplane's against it). Sourced; defines
# golden_cases, which calls `golden_case NAME SUBCOMMAND ARGS...` once per case (stdout and
# exit status compared) or `golden_case_err NAME ...` (stderr too); the case's expected
# output is expected/NAME.out. Plain bash.
#
# Both run on copies whose all-zero blocks are holes (golden_sparsify): qemu-img map says
# "zero" for data clusters over holes, and git keeps no holes, so every copy is made
# sparse the same way before anything looks at it.
GOLDEN_QCOW2="empty data v2 extl2 snap base mid top compressed zstd rc1 rc64 c512 dirty leaks
corrupt extdata prealloc bitmaps bminuse frag"

golden_cases() {
	local b
	for b in $GOLDEN_QCOW2; do
		golden_case "$b.info" info "$b.qcow2"
		golden_case "$b.info-json" info --output=json "$b.qcow2"
		golden_case "$b.check" check "$b.qcow2"
		golden_case "$b.check-json" check --output=json "$b.qcow2"
		golden_case "$b.map" map "$b.qcow2"
		golden_case "$b.map-json" map --output=json "$b.qcow2"
	done
	# check's findings on stderr, line by line.
	golden_case_err leaks.check-err check leaks.qcow2
	golden_case_err leaks.check-q-err check -q leaks.qcow2
	golden_case_err corrupt.check-err check corrupt.qcow2
	golden_case_err corrupt.check-json-err check --output=json corrupt.qcow2
	golden_case top.info-chain info --backing-chain top.qcow2
	golden_case top.info-chain-json info --backing-chain --output=json top.qcow2
	golden_case ovl-raw.info info ovl-raw.qcow2
	golden_case ovl-raw.info-chain-json info --backing-chain --output=json ovl-raw.qcow2
	golden_case odd.info info -f raw odd.raw
	golden_case odd.map-json map --output=json -f raw odd.raw
	golden_case ovl-odd.map map ovl-odd.qcow2
	golden_case ovl-odd.map-json map --output=json ovl-odd.qcow2
	golden_case ovl-odd.info-chain info --backing-chain ovl-odd.qcow2
	golden_case nobacking.info info nobacking.qcow2
	golden_case nobacking.check check nobacking.qcow2
	golden_case nobacking.check-json check --output=json nobacking.qcow2
	golden_case nobacking.map map nobacking.qcow2
	golden_case utf8.info info utf8.qcow2
	golden_case utf8.info-json info --output=json utf8.qcow2
	golden_case blank.info info -f raw blank.raw
	golden_case blank.info-json info --output=json blank.raw
	golden_case blank.check check blank.raw
	golden_case data.map-range map --output=json --start-offset=128k --max-length=1M data.qcow2
	# Nothing to map: qemu-img prints one entry of zero bytes.
	golden_case empty.map-at-end map --output=json --start-offset=1M empty.qcow2
	golden_case empty.map-past-end map --output=json --start-offset=3M empty.qcow2
	golden_case empty.map-no-length map --output=json --start-offset=4k --max-length=0 \
		empty.qcow2
	golden_case empty.map-no-length-human map --max-length=0 empty.qcow2
	golden_sizes
}

# Sizes as qemu-img reads them: past the end of empty.qcow2, map prints the offset it
# read (and nothing with exit 1 for a bad one). Case size-N-WORD: the Nth of GOLDEN_SIZES.
GOLDEN_SIZES=(1 00012 1k 1K 1m 1M 1g 1G 1T 1P 1E 7E 8E 16E 1b 1B 1KB 1KiB 1.5G 1.5 0.5k 1.1k
	1.0001k 1.0005k 1.0004k 1.00048828125k 1.0 1. 1.k 5.e 1.5e 1.5e3 1.e3 .5k 0x1000 0x1k
	0x1.8k 0x 00x1 1e3 +1 ' 1' '1 ' '+ 2k' 10Q 2kb 1.5b 99999999999999999999
	99999999999999999999k 18446744073709551615 9223372036854775807 9223372036854775808
	17179869184G 0x10000000000000000 -1 '' 1.99999999999999999999M 1.0000000000000000000001)
golden_sizes() {
	local i w
	for i in "${!GOLDEN_SIZES[@]}"; do
		w=$(printf '%s' "${GOLDEN_SIZES[$i]}" | tr -c 'A-Za-z0-9' _)
		golden_case "size-$i-$w" map --output=json --start-offset="${GOLDEN_SIZES[$i]}" \
			empty.qcow2
	done
}

# golden_sparsify FILE...: every all-zero block of each FILE becomes a hole. Fails where the
# file system cannot punch holes.
golden_sparsify() {
	local f
	for f in "$@"; do
		fallocate --dig-holes "$f" || return
	done
}

# golden_normalise: stdin to stdout, with what depends on the host's file system (the space
# a file takes) replaced by a placeholder.
golden_normalise() {
	sed -E -e 's/^disk size: .*/disk size: N/' -e 's/"actual-size": [0-9]+/"actual-size": N/' \
		-e 's/^(qemu-img|ioplane img): /PROG: /'
}
