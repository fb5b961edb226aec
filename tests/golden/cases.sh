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
corrupt extdata prealloc"

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
	golden_case top.info-chain info --backing-chain top.qcow2
	golden_case top.info-chain-json info --backing-chain --output=json top.qcow2
	golden_case ovl-raw.info info ovl-raw.qcow2
	golden_case ovl-raw.info-chain-json info --backing-chain --output=json ovl-raw.qcow2
	golden_case blank.info info -f raw blank.raw
	golden_case blank.info-json info --output=json blank.raw
	golden_case blank.check check blank.raw
	golden_case data.map-range map --output=json --start-offset=128k --max-length=1M data.qcow2
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
