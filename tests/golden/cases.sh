# The golden-output cases of `ioplane img` (info, check, map) on the fixed images in this
# directory, shared by make-images.sh (which records qemu-img's output as the expected one)
# and tests/func/test-img-golden.sh (which checks ioplane's against it). Sourced; defines
# golden_cases, which calls `golden_case NAME SUBCOMMAND ARGS...` once per case; the case's
# expected output is expected/NAME.out. Plain bash.

# Images whose content does not depend on how the file system stores holes (raw files lose
# their holes in git, so no raw image is mapped).
GOLDEN_QCOW2="empty data v2 extl2 snap base mid top compressed zstd rc1 rc64 c512 dirty leaks
corrupt extdata"

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

# golden_normalise: stdin to stdout, with what depends on the host's file system (the space
# a file takes) replaced by a placeholder.
golden_normalise() {
	sed -E -e 's/^disk size: .*/disk size: N/' -e 's/"actual-size": [0-9]+/"actual-size": N/'
}
