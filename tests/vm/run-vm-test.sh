#!/usr/bin/env bash
# ioplane's copy of the VM test recipe (tests/vm/test-vm-vhost.sh drives it); additions:
# --discard-zero (the discard must succeed and the range read back as zeroes),
# --flush-required (the guest must have sent FLUSH requests), --hotplug CMD with
# --resize-mb N: the guest boots without the disk, CMD hot-plugs it (and resizes it),
# and --migrate: the guest is live-migrated to a second QEMU while it writes and verifies;
# --scsi: the disk is LUN 0 of a vhost-user-scsi-pci controller (the guest's sd driver),
# --scsi-luns N: the guest must see N LUNs and verifies data written to each, and
# --lun-cmd CMD: after its checks the guest waits for a LUN hot-added by CMD.
#
# run-vm-test.sh - boot a tiny Linux guest under QEMU TCG (no KVM needed) whose
# disk is served by a storage server on this host, and verify guest I/O end to end.
#
# Client paths (--mode):
#   vhost       (default) guest /dev/vda = vhost-user-blk-pci; the server gets the
#               virtqueues over a unix socket (vhost-user protocol)
#   nbd         guest /dev/vda = virtio-blk-pci emulated by QEMU, backed by QEMU's
#               built-in NBD client (unix socket, or TCP with --nbd-tcp)
#   nbd-kernel  guest /dev/nbd0 = the guest Linux kernel's nbd driver + nbd-client,
#               over virtio-net/slirp to a TCP NBD server on this host;
#               --num-queues = number of NBD connections (-C), each a blk-mq queue
#
# The guest (Debian cloud kernel + busybox initramfs) checks a host-seeded region,
# writes/reads/verifies random patterns (serially, then in parallel from every vCPU
# so that every queue is used; with fsync => FLUSH), issues a discard, measures dd
# throughput, optionally runs fio, prints "VMTEST: RESULT PASS|FAIL" on the serial
# console and powers off.  Exit status: 0 PASS, 1 FAIL, 2 setup error.
#
# Server selection (default: qemu-storage-daemon serving a fresh raw file):
#   --socket PATH       server already running, listening on unix socket PATH
#                       (vhost-user socket, or NBD socket in nbd mode)
#   --nbd-tcp HOST:PORT server already running, NBD over TCP (nbd, nbd-kernel)
#   --server-cmd CMD    shell command that starts YOUR server in the foreground.
#                       Run with bash -c in its own process group, with exported:
#                         VMTEST_SOCK       unix socket path to listen on (vhost, nbd)
#                         VMTEST_NBD_HOST   TCP address to listen on (nbd-kernel: 127.0.0.1)
#                         VMTEST_NBD_PORT   TCP port to listen on     (nbd-kernel)
#                         VMTEST_EXPORT     NBD export name the client asks for
#                         VMTEST_IMG        raw image to serve (pre-created,
#                                           --disk-mb MiB, last 4 MiB seeded)
#                         VMTEST_SIZE_MB    image size in MiB
#                         VMTEST_NUM_QUEUES queues (vhost/nbd) or connections (nbd-kernel)
#                         VMTEST_MODE       vhost | nbd | nbd-kernel
#                       The script waits for the socket/port, and kills the process
#                       group when done (or at once if it exits during the test).
#   e.g. --server-cmd 'exec ./my-server --vhost-user "$VMTEST_SOCK" --file "$VMTEST_IMG"'
#
# Needs (Debian 12): qemu-system-x86, qemu-utils (qemu-storage-daemon),
# busybox-static, cpio, gzip, dpkg-deb, apt-get (downloads the kernel .deb once,
# plus nbd-client/libnl-genl-3-200 for nbd-kernel; nothing is installed), fio (--fio).
# Run with --help for all options.
set -euo pipefail

# ----------------------------------------------------------------- defaults --
MODE=vhost
SOCKET=""
NBD_TCP=""
SERVER_CMD=""
NBD_EXPORT=disk0
NUM_QUEUES=2
SMP=""
MEM_MB=""
DISK_MB=256
TEST_MB=16
PERF_MB=""             # default 64 (16 in nbd-kernel mode: slirp networking is slow)
PERF4K_MB=""           # default 16 (2 in nbd-kernel mode)
SEED_MB=4
FIO=0
FIO_RUNTIME=10
IMAGE=""               # raw file behind an external server, verified afterwards
IMAGE_CHECKS=1
WORKDIR=/tmp/vmtest
TIMEOUT=900
KERNEL_PKG=linux-image-cloud-amd64   # metapackage; resolved to the versioned one
KERNEL_DEB=""
DEVICE_OPTS=""
QEMU_EXTRA=()
KEEP=0
VERBOSE=0
DISCARD_ZERO=0
FLUSH_REQUIRED=0
HOTPLUG_CMD=""
RESIZE_MB=0
MIGRATE=0
MIGRATE_FLAG_MB=1       # MiB before the seed region: where the host says "migrated"
SCSI=0
SCSI_LUNS=0
LUN_CMD=""

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --mode vhost|nbd|nbd-kernel   client path (default $MODE)
  --socket PATH          use an already-running server on this unix socket
  --nbd-tcp HOST:PORT    use an already-running NBD server over TCP
  --server-cmd CMD       start this server command instead of qemu-storage-daemon
  --nbd-export NAME      NBD export name (default $NBD_EXPORT)
  --num-queues N         virtqueues (vhost, nbd) / NBD connections (nbd-kernel); default $NUM_QUEUES
  --smp N                guest vCPUs (default: = num-queues). virtio-blk uses
                         min(num-queues, vCPUs) queues, one per CPU
  --mem MB               guest RAM (default 512, 1024 with --fio)
  --disk-mb N            size of the image created for the server (default $DISK_MB)
  --test-mb N            size of the verified pattern region (default $TEST_MB)
  --perf-mb N            size of the 1M dd runs, 0 = skip (default 64; nbd-kernel 16)
  --perf4k-mb N          size of the 4k dd runs, 0 = skip (default 16; nbd-kernel 2)
  --fio                  add /usr/bin/fio (+ its libs) to the initramfs; run libaio
                         randread QD32 and a randwrite+crc32c-verify job per vCPU
  --fio-runtime S        randread runtime in seconds (default $FIO_RUNTIME)
  --image FILE           raw file behind an external server (--socket/--nbd-tcp);
                         its pattern region is checked after the guest powered off
  --no-image-checks      skip seed check and host-side verification (use when your
                         server does not serve VMTEST_IMG)
  --device-opts STR      extra -device properties (vhost, nbd), e.g. queue-size=256
  --qemu-arg ARG         extra QEMU argument, repeatable (e.g. --qemu-arg -trace
                         --qemu-arg 'vhost_user*')
  --kernel-deb FILE      use this linux-image-*.deb instead of downloading one
  --workdir DIR          cache + run directory (default $WORKDIR)
  --timeout S            overall guest timeout (default $TIMEOUT)
  --keep                 keep the per-run directory (image, logs, initramfs)
  --verbose              full kernel log on the console (no 'quiet')
  --hotplug CMD          vhost mode: QEMU starts without the disk and with a QMP
                         monitor at \$VMTEST_QEMU_QMP; the server is ready when
                         \$VMTEST_SOCK.qmp exists (its monitor); CMD (bash -c, in the
                         background) adds the export and the device once the guest
                         printed "VMTEST: waiting for the disk" in \$VMTEST_CONSOLE.
                         It must exit 0
  --resize-mb N          after its checks the guest waits (300 s) until the disk has
                         N MiB, without a reboot; CMD resizes it when the guest
                         printed "VMTEST: waiting for resize"
  --scsi                 vhost mode: a vhost-user-scsi-pci controller; the disk is LUN 0
  --scsi-luns N          the guest must see N SCSI disks; it writes and reads back 1 MiB
                         on each but LUN 0 (which gets every check)
  --lun-cmd CMD          with --scsi: the server also has a monitor at \$VMTEST_SOCK.qmp;
                         CMD (bash -c, in the background) hot-adds a LUN once the guest
                         printed "VMTEST: waiting for a new LUN"; the guest verifies it
                         as above. It must exit 0
  --migrate              vhost mode: the server must also listen on \$VMTEST_SOCK2 (the
                         same disk); a second QEMU waits there with -incoming. After its
                         checks the guest writes and verifies from every vCPU (and fio at
                         depth 32 with --fio) and prints "VMTEST: migrate now"; the host
                         migrates it (QMP migrate, query-migrate: total time and downtime
                         in the summary), the source quits, and the guest goes on on the
                         destination until the host marks the disk (the MiB before the
                         seed region), then verifies once more and reports from there
Guest disk layout (MiB): [0,test) pattern | [test,test+max(perf,perf4k,16)) perf,
fio, discard scratch | last $SEED_MB MiB: seeded by the host, only read.
The guest WRITES to the disk: never point this at data you care about.
EOF
}

die() { echo "run-vm-test: ERROR: $*" >&2; exit 2; }
log() { echo "run-vm-test: $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --mode) MODE=$2; shift ;;
    --socket) SOCKET=$2; shift ;;
    --nbd-tcp) NBD_TCP=$2; shift ;;
    --server-cmd) SERVER_CMD=$2; shift ;;
    --nbd-export) NBD_EXPORT=$2; shift ;;
    --num-queues) NUM_QUEUES=$2; shift ;;
    --smp) SMP=$2; shift ;;
    --mem) MEM_MB=$2; shift ;;
    --disk-mb) DISK_MB=$2; shift ;;
    --test-mb) TEST_MB=$2; shift ;;
    --perf-mb) PERF_MB=$2; shift ;;
    --perf4k-mb) PERF4K_MB=$2; shift ;;
    --fio) FIO=1 ;;
    --fio-runtime) FIO_RUNTIME=$2; shift ;;
    --image) IMAGE=$2; shift ;;
    --no-image-checks) IMAGE_CHECKS=0 ;;
    --device-opts) DEVICE_OPTS=$2; shift ;;
    --qemu-arg) QEMU_EXTRA+=("$2"); shift ;;
    --kernel-deb) KERNEL_DEB=$2; shift ;;
    --workdir) WORKDIR=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --keep) KEEP=1 ;;
    --discard-zero) DISCARD_ZERO=1 ;;
    --flush-required) FLUSH_REQUIRED=1 ;;
    --hotplug) HOTPLUG_CMD=$2; shift ;;
    --resize-mb) RESIZE_MB=$2; shift ;;
    --migrate) MIGRATE=1 ;;
    --scsi) SCSI=1 ;;
    --scsi-luns) SCSI_LUNS=$2; shift ;;
    --lun-cmd) LUN_CMD=$2; shift ;;
    --verbose) VERBOSE=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
  shift
done

case "$MODE" in vhost|nbd|nbd-kernel) ;; *) die "--mode must be vhost, nbd or nbd-kernel" ;; esac
[ -n "$NBD_TCP" ] && [ "$MODE" = vhost ] && die "--nbd-tcp needs --mode nbd or nbd-kernel"
[ -n "$SOCKET" ] && [ "$MODE" = nbd-kernel ] && die "--mode nbd-kernel needs TCP: use --nbd-tcp"
n=0; [ -n "$SOCKET" ] && n=$((n+1)); [ -n "$NBD_TCP" ] && n=$((n+1)); [ -n "$SERVER_CMD" ] && n=$((n+1))
[ $n -le 1 ] || die "use only one of --socket, --nbd-tcp, --server-cmd"
if [ "$MODE" = nbd-kernel ]; then PERF_MB=${PERF_MB:-16}; PERF4K_MB=${PERF4K_MB:-2}; fi
PERF_MB=${PERF_MB:-64}; PERF4K_MB=${PERF4K_MB:-16}
for v in NUM_QUEUES DISK_MB TEST_MB PERF_MB PERF4K_MB FIO_RUNTIME TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number"
done
[ "$NUM_QUEUES" -ge 1 ] && [ "$TEST_MB" -ge 1 ] || die "num-queues and test-mb must be >= 1"
if [ $MIGRATE = 1 ]; then
  [ "$MODE" = vhost ] && [ -n "$SERVER_CMD" ] && [ -z "$HOTPLUG_CMD" ] ||
    die "--migrate needs --mode vhost and --server-cmd, without --hotplug"
  command -v python3 >/dev/null || die "--migrate needs python3"
fi
[ -z "$SMP" ] && SMP=$NUM_QUEUES
[ -z "$MEM_MB" ] && { [ $FIO = 1 ] && MEM_MB=1024 || MEM_MB=512; }
PERF_SPAN=$(( PERF_MB > PERF4K_MB ? PERF_MB : PERF4K_MB ))
[ $PERF_SPAN -lt 16 ] && PERF_SPAN=16                 # discard + fio verify scratch
EXTERNAL=0; { [ -n "$SOCKET" ] || [ -n "$NBD_TCP" ]; } && EXTERNAL=1
SEED=$IMAGE_CHECKS; [ $EXTERNAL = 1 ] && SEED=0       # never modify an image under a running server
if [ $EXTERNAL = 0 ] && [ $(( TEST_MB + PERF_SPAN + SEED_MB )) -gt "$DISK_MB" ]; then
  die "--disk-mb $DISK_MB too small for test+perf+seed ($TEST_MB+$PERF_SPAN+$SEED_MB MiB)"
fi

for t in qemu-system-x86_64 busybox cpio gzip dpkg-deb sha256sum timeout ldd; do
  command -v "$t" >/dev/null || die "missing tool: $t"
done
BUSYBOX=$(command -v busybox)
if ldd "$BUSYBOX" >/dev/null 2>&1; then die "$BUSYBOX is dynamically linked; install busybox-static"; fi
if [ $EXTERNAL = 0 ] && [ -z "$SERVER_CMD" ]; then
  command -v qemu-storage-daemon >/dev/null || die "missing qemu-storage-daemon (qemu-utils)"
fi
if [ $FIO = 1 ]; then command -v fio >/dev/null || die "--fio needs fio on the host"; fi

mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
RUN=$(mktemp -d "$WORKDIR/run.XXXXXX")
IMG=$RUN/disk.raw
CONSOLE_LOG=$RUN/console.log
SERVER_LOG=$RUN/server.log
SERVER_PID=""
SOCK=""; NBD_HOST=""; NBD_PORT=""
if [ "$MODE" = nbd-kernel ] || [ -n "$NBD_TCP" ]; then
  if [ -n "$NBD_TCP" ]; then NBD_HOST=${NBD_TCP%:*}; NBD_PORT=${NBD_TCP##*:}
  else NBD_HOST=127.0.0.1; NBD_PORT=""; fi      # port picked in start_server
else
  SOCK=${SOCKET:-$RUN/$MODE.sock}
fi

GUEST_PID=""; WATCH_PID=""
cleanup() {
  local rc=$? qp
  if [ -n "$GUEST_PID" ]; then          # interrupted while the guest was running
    qp=$(cat "$RUN/qemu.pid" 2>/dev/null || true)
    if [ -n "$qp" ]; then kill -TERM "$qp" 2>/dev/null || true; fi
    wait "$GUEST_PID" 2>/dev/null || true
  fi
  qp=$(cat "$RUN/qemu2.pid" 2>/dev/null || true)   # a migration's destination
  if [ -n "$qp" ] && kill -0 "$qp" 2>/dev/null; then kill -TERM "$qp" 2>/dev/null || true; fi
  if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null || true; fi
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || kill -KILL "$SERVER_PID" 2>/dev/null || true
  fi
  if [ $KEEP = 1 ] || [ $rc -ne 0 ]; then log "run directory kept: $RUN"; else rm -rf "$RUN"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 2' INT TERM

# ------------------------------------------------------------------ debs --
# apt-get download (cached in $WORKDIR/debs); packages are extracted, never installed.
fetch_deb() {
  local pkg=$1 deb
  mkdir -p "$WORKDIR/debs"
  deb=$(ls "$WORKDIR"/debs/"${pkg}"_*.deb 2>/dev/null | tail -1 || true)
  if [ -z "$deb" ]; then
    log "downloading $pkg"
    (cd "$WORKDIR/debs" && apt-get -q -o APT::Sandbox::User=root download "$pkg" >&2) || die "apt-get download $pkg failed"
    deb=$(ls "$WORKDIR"/debs/"${pkg}"_*.deb | tail -1)
  fi
  echo "$deb"
}
extract_deb() { # deb -> prints extraction dir (cached)
  local d=$WORKDIR/extract/$(basename "$1" .deb)
  if [ ! -e "$d/.done" ]; then rm -rf "$d"; mkdir -p "$d"; dpkg-deb -x "$1" "$d"; touch "$d/.done"; fi
  echo "$d"
}

get_kernel() {
  local deb pkg
  if [ -n "$KERNEL_DEB" ]; then
    deb=$(readlink -f "$KERNEL_DEB")
  else
    pkg=$(apt-cache depends "$KERNEL_PKG" 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [ -n "$pkg" ] || die "cannot resolve $KERNEL_PKG (run apt-get update?)"
    deb=$(fetch_deb "$pkg")
  fi
  KDIR=$(extract_deb "$deb")
  VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* | head -1)
  KVER=${VMLINUZ##*/vmlinuz-}
  MODDIR=$KDIR/lib/modules/$KVER
  KDEB_NAME=$(basename "$deb")
}

# Module dependencies come from each .ko's .modinfo (no kmod/depmod needed).
mod_deps() { tr '\0' '\n' < "$1" | sed -n 's/^depends=//p' | tr ',' ' '; }
mod_path() { find "$MODDIR/kernel" \( -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" \) | head -1; }
MOD_ORDER=()
add_module() {  # append module + deps (deps first) to MOD_ORDER; built-ins are skipped
  local m=$1 p d
  m=${m//-/_}
  case " ${MOD_ORDER[*]:-} " in *" $m "*) return 0 ;; esac
  p=$(mod_path "$m")
  if [ -z "$p" ]; then
    if grep -q "/$m.ko\$" "$MODDIR/modules.builtin" 2>/dev/null; then return 0; fi
    die "module $m not found in $MODDIR"
  fi
  case "$p" in *.ko) ;; *) die "compressed module $p: busybox insmod needs plain .ko" ;; esac
  for d in $(mod_deps "$p"); do add_module "$d"; done
  MOD_ORDER+=("$m")
}

# Copy an executable plus every library ldd resolves for it into DEST (a rootfs).
# Files that live under XROOT (an extracted .deb) are placed at their path inside it.
copy_with_libs() { # DEST XROOT BIN LIBPATH
  local dest=$1 xroot=$2 bin=$3 libpath=$4 f rel
  mkdir -p "$dest/usr/bin"; cp -L "$bin" "$dest/usr/bin/"
  if LD_LIBRARY_PATH=$libpath ldd "$bin" | grep -q 'not found'; then
    LD_LIBRARY_PATH=$libpath ldd "$bin" >&2; die "unresolved libraries for $bin"
  fi
  for f in $(LD_LIBRARY_PATH=$libpath ldd "$bin" | awk '{for(i=1;i<=NF;i++) if ($i ~ /^\//) print $i}' | sort -u); do
    rel=$f; [ -n "$xroot" ] && [ "${f#"$xroot"/}" != "$f" ] && rel=/${f#"$xroot"/}
    mkdir -p "$dest$(dirname "$rel")"; cp -L "$f" "$dest$rel"
  done
}
mk_cpio() { (cd "$1" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet); }

# -------------------------------------------------------------- guest init --
write_guest_init() {
cat > "$1" <<'GUESTINIT'
#!/bin/sh
# vmtest guest /init (busybox ash). Parameters arrive as vmtest.key=value on the kernel command line.
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys

say()  { echo "VMTEST: $*"; }
up()   { cut -d' ' -f1 /proc/uptime; }
FAILS=0
bad()  { say "ERROR $*"; FAILS=$((FAILS+1)); }
finish() {
  if [ -n "$P_nbd_port" ] && [ -b /dev/$DEV ]; then
    nbd-client -d /dev/$DEV >/dev/null 2>&1 && say "nbd_disconnect=ok" || say "nbd_disconnect=failed (info only)"
  fi
  if [ $FAILS -eq 0 ]; then say "RESULT PASS uptime=$(up)s"; else say "RESULT FAIL errors=$FAILS uptime=$(up)s"; fi
  sync; poweroff -f; sleep 30
}
sha() { sha256sum | cut -d' ' -f1; }

for kv in $(cat /proc/cmdline); do
  case "$kv" in
    vmtest.*=*) k=${kv%%=*}; k=${k#vmtest.}
      case "$k" in *[!a-z0-9_]*) continue;; esac
      eval "P_$k=\${kv#*=}";;
  esac
done
T=${P_test_mb:-16}; PERF=${P_perf_mb:-0}; PERF4K=${P_perf4k_mb:-0}; SPAN=${P_span_mb:-16}
DEV=${P_dev:-vda}
say "guest init at $(up)s kernel=$(uname -r) cpus=$(nproc)"
dmesg | grep -q 'Initramfs unpacking failed' && bad "kernel: $(dmesg | grep -m1 'Initramfs unpacking failed')"

for m in $(cat /lib/modules/load-order); do
  insmod /lib/modules/$m.ko 2>/tmp/insmod.err || { grep -q 'File exists' /tmp/insmod.err || bad "insmod $m: $(cat /tmp/insmod.err)"; }
done

if [ -n "$P_nbd_port" ]; then         # guest kernel NBD client over virtio-net + slirp
  i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  ip link set lo up; ip link set eth0 up
  ip addr add 10.0.2.15/24 dev eth0; ip route add default via 10.0.2.2
  say "nbd-client $P_nbd_host:$P_nbd_port export=$P_nbd_export connections=$P_nbd_conns"
  nbd-client -N "$P_nbd_export" "$P_nbd_host" "$P_nbd_port" /dev/$DEV -C "$P_nbd_conns" 2>&1 \
    | sed 's/^/  nbd-client: /' || true
fi
if [ "${P_scsi:-0}" = 1 ]; then      # the sd disk of LUN 0 (names follow probe order)
  i=0; while ! ls /sys/bus/scsi/devices/*:0:0:0/block/* >/dev/null 2>&1 && [ $i -lt 300 ]; do
    sleep 0.1; i=$((i+1)); done
  DEV=$(ls /sys/bus/scsi/devices/*:0:0:0/block/ 2>/dev/null | head -n 1)
  [ -n "$DEV" ] || { bad "no SCSI disk for LUN 0"; dmesg | tail -20; finish; }
  say "scsi: LUN 0 is $DEV"
fi
W=300; [ "${P_hotplug:-0}" = 1 ] && { W=6000; say "waiting for the disk"; }
i=0; while ! { [ -b /dev/$DEV ] && [ "$(cat /sys/block/$DEV/size 2>/dev/null || echo 0)" -gt 0 ]; } && [ $i -lt $W ]; do
  sleep 0.1; i=$((i+1)); done
[ -b /dev/$DEV ] && [ "$(cat /sys/block/$DEV/size)" -gt 0 ] || { bad "no usable /dev/$DEV after 30s"; dmesg | tail -20; finish; }
say "$DEV ready at $(up)s"

# ---- what the guest sees
B=/sys/block/$DEV
DISK_MB=$(( $(cat $B/size) / 2048 ))
NQ=$(ls -d $B/mq/* | wc -l)
say "disk_mb=$DISK_MB lbs=$(cat $B/queue/logical_block_size) pbs=$(cat $B/queue/physical_block_size) ro=$(cat $B/ro) write_cache=\"$(cat $B/queue/write_cache)\" max_sectors_kb=$(cat $B/queue/max_sectors_kb) max_segments=$(cat $B/queue/max_segments) discard_max_bytes=$(cat $B/queue/discard_max_bytes) write_zeroes_max_bytes=$(cat $B/queue/write_zeroes_max_bytes)"
say "guest_queues=$NQ"
for q in $B/mq/*; do say "queue ${q##*/} cpu_list=$(cat $q/cpu_list) nr_tags=$(cat $q/nr_tags)"; done
if [ -r $B/device/features ]; then
  F=$(cat $B/device/features); fl=""
  for nb in 1:SIZE_MAX 2:SEG_MAX 4:GEOMETRY 5:RO 6:BLK_SIZE 9:FLUSH 10:TOPOLOGY 11:CONFIG_WCE 12:MQ 13:DISCARD 14:WRITE_ZEROES 28:INDIRECT_DESC 29:EVENT_IDX 32:VERSION_1 33:ACCESS_PLATFORM 34:RING_PACKED 35:IN_ORDER 40:RING_RESET; do
    n=${nb%%:*}; [ "$(echo "$F" | cut -c$((n+1)))" = 1 ] && fl="$fl ${nb#*:}"
  done
  say "virtio_features=$F ($fl )"
fi
EXPQ=${P_expect_queues:-0}
[ "$EXPQ" -gt 0 ] && [ "$NQ" -ne "$EXPQ" ] && say "WARN expected $EXPQ queues, guest has $NQ"
[ "$DISK_MB" -ge $((T + SPAN)) ] || { bad "disk ${DISK_MB}MiB smaller than test+perf ${T}+${SPAN}MiB"; finish; }
# virtio-blk's initial cache mode comes from config.wce (qemu-storage-daemon: write through).
# Switch to write back where allowed (VIRTIO_BLK_F_CONFIG_WCE; the write reaches the server),
# so that the fsyncs below really send FLUSH requests.
WC0=$(cat $B/queue/write_cache)
if [ "${P_wce:-1}" = 1 ] && [ "$WC0" != "write back" ] && [ -w $B/cache_type ]; then
  echo "write back" > $B/cache_type 2>/dev/null
  say "cache_type: \"$WC0\" -> \"$(cat $B/queue/write_cache)\""
fi

# ---- 1. region seeded by the host before the server started (read only)
if [ -n "$P_seed_sha" ]; then
  s=$(dd if=/dev/$DEV bs=1M skip=$((DISK_MB - P_seed_mb)) count=$P_seed_mb iflag=direct 2>/dev/null | sha)
  [ "$s" = "$P_seed_sha" ] && say "seed_check=ok" || bad "seed region mismatch: got $s want $P_seed_sha"
fi

# ---- 2. serial write (O_DIRECT, then fsync => FLUSH) and O_DIRECT read back
dd if=/dev/urandom of=/tmp/patA bs=1M count=$T 2>/dev/null
A=$(sha </tmp/patA)
dd if=/tmp/patA of=/dev/$DEV bs=1M count=$T oflag=direct conv=notrunc,fsync 2>/dev/null || bad "serial write failed"
s=$(dd if=/dev/$DEV bs=1M count=$T iflag=direct 2>/dev/null | sha)
[ "$s" = "$A" ] && say "serial_rw=ok" || bad "serial readback mismatch"
rm -f /tmp/patA

# ---- 3. parallel: one writer pinned to each vCPU (=> each blk-mq queue), 64 KiB blocks,
#         then readers pinned to a different CPU verify each chunk, then a full read
NC=$(nproc)
dd if=/dev/urandom of=/tmp/patB bs=1M count=$T 2>/dev/null
Bsum=$(sha </tmp/patB)
CH=$(( T * 16 / NC ))            # chunk size in 64 KiB blocks
c=0; pids=""
while [ $c -lt $NC ]; do
  cnt=$CH; [ $c -eq $((NC-1)) ] && cnt=$(( T*16 - CH*(NC-1) ))
  taskset -c $c dd if=/tmp/patB of=/dev/$DEV bs=64k skip=$((c*CH)) seek=$((c*CH)) count=$cnt oflag=direct conv=notrunc,fsync 2>/dev/null &
  pids="$pids $!"; c=$((c+1))
done
for p in $pids; do wait $p || bad "parallel writer $p failed"; done
dd if=/dev/null of=/dev/$DEV count=0 conv=notrunc,fsync 2>/dev/null || bad "flush (fsync) failed"
c=0; pids=""
while [ $c -lt $NC ]; do
  cnt=$CH; [ $c -eq $((NC-1)) ] && cnt=$(( T*16 - CH*(NC-1) ))
  ( want=$(dd if=/tmp/patB bs=64k skip=$((c*CH)) count=$cnt 2>/dev/null | sha)
    got=$(taskset -c $(( (c+1) % NC )) dd if=/dev/$DEV bs=64k skip=$((c*CH)) count=$cnt iflag=direct 2>/dev/null | sha)
    [ "$want" = "$got" ] ) &
  pids="$pids $!"; c=$((c+1))
done
for p in $pids; do wait $p || bad "parallel chunk readback mismatch"; done
s=$(dd if=/dev/$DEV bs=1M count=$T iflag=direct 2>/dev/null | sha)
[ "$s" = "$Bsum" ] && say "parallel_rw=ok" || bad "parallel full readback mismatch"
say "pattern_sha256=$Bsum pattern_mb=$T"
rm -f /tmp/patB
# per-queue evidence for virtio-blk: MSI-X interrupts per request queue
awk -v n=$NC '/virtio[0-9]+-req/ {t=0; for (i=2; i<=n+1; i++) t+=$i; printf "VMTEST: irq %s total=%d\n", $NF, t}' /proc/interrupts

# ---- 4. discard 1 MiB of scratch space (informational only, unless discard_zero=1:
#         then it must work and the range must read back as zeroes)
if [ "${P_discard_zero:-0}" = 1 ]; then
  [ "$(cat $B/queue/discard_max_bytes)" -gt 0 ] || bad "no discard support"
  dd if=/dev/urandom of=/dev/$DEV bs=64k count=16 seek=$((T*16)) oflag=direct conv=notrunc,fsync 2>/dev/null || bad "write before discard failed"
  blkdiscard -o $((T*1048576)) -l 1048576 /dev/$DEV || bad "discard failed"
  zs=$(dd if=/dev/zero bs=64k count=16 2>/dev/null | sha)
  ds=$(dd if=/dev/$DEV bs=64k count=16 skip=$((T*16)) iflag=direct 2>/dev/null | sha)
  [ "$zs" = "$ds" ] && say "discard=ok (reads back as zeroes)" || bad "discarded range does not read as zeroes"
elif [ "$(cat $B/queue/discard_max_bytes)" -gt 0 ]; then
  blkdiscard -o $((T*1048576)) -l 1048576 /dev/$DEV 2>/dev/null && say "discard=ok" || say "discard=failed (info only)"
fi

# ---- 5. dd throughput in [T, T+PERF) MiB (single stream, queue depth 1)
ddperf() { # label bs_kib count dd-args...
  l=$1; bk=$2; n=$3; shift 3
  t0=$(up); dd bs=${bk}k count=$n "$@" 2>/dev/null || bad "dd $l failed"; t1=$(up)
  awk -v l="$l" -v b=$((bk*1024*n)) -v n=$n -v a=$t0 -v z=$t1 'BEGIN{d=z-a; if(d<0.01)d=0.01;
       printf "VMTEST: perf %s %.1f MiB/s %.0f IOPS (%.2fs)\n", l, b/1048576/d, n/d, d}'
}
if [ $PERF -ge 1 ]; then
  ddperf dd_write_1M_direct 1024 $PERF if=/dev/zero of=/dev/$DEV seek=$T oflag=direct conv=notrunc
  ddperf dd_read_1M_direct  1024 $PERF if=/dev/$DEV of=/dev/null skip=$T iflag=direct
fi
if [ $PERF4K -ge 1 ]; then
  ddperf dd_write_4k_direct 4 $((PERF4K*256)) if=/dev/zero of=/dev/$DEV seek=$((T*256)) oflag=direct conv=notrunc
  ddperf dd_read_4k_direct  4 $((PERF4K*256)) if=/dev/$DEV of=/dev/null skip=$((T*256)) iflag=direct
  echo 3 > /proc/sys/vm/drop_caches
  ddperf dd_read_4k_buffered 4 $((PERF4K*256)) if=/dev/$DEV of=/dev/null skip=$((T*256))
fi

# ---- 6. fio (present only if its cpio was appended to the initramfs)
[ "${P_fio:-0}" = 1 ] && [ ! -x /usr/bin/fio ] && bad "fio requested but missing from the initramfs"
if [ -x /usr/bin/fio ] && [ "${P_fio:-0}" = 1 ]; then
  R=${P_fio_runtime:-10}; FS=${P_fio_mb:-16}
  say "fio $(fio --version)"
  fio --name=randread --filename=/dev/$DEV --thread --ioengine=libaio --direct=1 --rw=randread \
      --bs=4k --iodepth=32 --runtime=$R --time_based --numjobs=1 > /tmp/fio.out 2>&1 \
      || bad "fio randread failed"
  cat /tmp/fio.out
  say "fio_randread_qd32 $(grep -m1 -E '^ *read: IOPS' /tmp/fio.out | sed 's/^ *//')"
  # randwrite + crc32c verify: one job per vCPU, pinned (=> all queues), disjoint ranges
  JS=$(( FS / NC )); [ $JS -lt 1 ] && JS=1
  fio --name=verify --filename=/dev/$DEV --thread --ioengine=libaio --direct=1 --rw=randwrite \
      --bs=4k --iodepth=32 --numjobs=$NC --cpus_allowed=0-$((NC-1)) --cpus_allowed_policy=split \
      --offset=${T}M --size=${JS}M --offset_increment=${JS}M --verify=crc32c --verify_fatal=1 \
      --group_reporting > /tmp/fio.out 2>&1 && say "fio_verify=ok ($NC jobs x ${JS}MiB QD32)" \
      || { cat /tmp/fio.out; bad "fio randwrite+verify failed"; }
  say "fio_verify_write $(grep -m1 -E '^ *write: IOPS' /tmp/fio.out | sed 's/^ *//')"
fi

set -- $(cat $B/stat)
say "io_stats reads=$1 writes=$5 discards=${12:-?} flushes=${16:-?} (block layer counters, whole run)"
[ "$(cat $B/queue/write_cache)" = "write back" ] && [ "${16:-1}" = 0 ] && say "WARN write-back cache but no FLUSH was sent"
[ "${P_flush_required:-0}" = 1 ] && [ "${16:-0}" = 0 ] && bad "no FLUSH request was sent"

# ---- SCSI: every LUN the guest should see, 1 MiB written and read back on each
lun_rw() {   # H:C:T:L
  local b s r
  b=$(ls /sys/class/scsi_disk/$1/device/block/ 2>/dev/null | head -n 1)
  [ -n "$b" ] || { bad "LUN $1 has no block device"; return; }
  [ "$b" = "$DEV" ] && return 0
  dd if=/dev/urandom of=/tmp/patL bs=64k count=16 2>/dev/null
  s=$(sha </tmp/patL)
  dd if=/tmp/patL of=/dev/$b bs=64k count=16 oflag=direct conv=notrunc,fsync 2>/dev/null || bad "LUN $1: write failed"
  r=$(dd if=/dev/$b bs=64k count=16 iflag=direct 2>/dev/null | sha)
  [ "$r" = "$s" ] && say "lun $1 ($b, $(( $(cat /sys/block/$b/size) / 2048 )) MiB) rw=ok" || bad "LUN $1: readback mismatch"
}
nluns() { ls /sys/class/scsi_disk | wc -l; }
if [ "${P_scsi_luns:-0}" -gt 0 ]; then
  i=0; while [ "$(nluns)" -lt "$P_scsi_luns" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  [ "$(nluns)" = "$P_scsi_luns" ] && say "scsi_luns=ok ($(ls /sys/class/scsi_disk | tr '\n' ' '))" \
    || bad "the guest sees $(nluns) SCSI disks, not $P_scsi_luns"
  for d in /sys/class/scsi_disk/*; do lun_rw "${d##*/}"; done
fi
if [ "${P_scsi_hotlun:-0}" = 1 ]; then   # the host adds a LUN over the server's QMP
  before=" $(ls /sys/class/scsi_disk | tr '\n' ' ')"
  n0=$(nluns)
  say "waiting for a new LUN"
  i=0; while [ "$(nluns)" -le "$n0" ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
  new=""
  for d in /sys/class/scsi_disk/*; do case "$before " in *" ${d##*/} "*) ;; *) new=${d##*/} ;; esac; done
  if [ -n "$new" ]; then
    i=0; while ! ls /sys/class/scsi_disk/$new/device/block/* >/dev/null 2>&1 && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    lun_rw "$new" && say "hotlun=ok $new"
  else
    bad "no new LUN appeared"
  fi
fi

if [ "${P_resize_sectors:-0}" -gt 0 ]; then   # the host grows the disk under us
  say "waiting for resize to $P_resize_sectors sectors (now $(cat $B/size))"
  i=0; while [ "$(cat $B/size)" != "$P_resize_sectors" ] && [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
  if [ "$(cat $B/size)" = "$P_resize_sectors" ]; then
    say "resize=ok sectors=$(cat $B/size) (no reboot)"
    # the new end is readable
    dd if=/dev/$DEV of=/dev/null bs=4k count=1 skip=$(( P_resize_sectors / 8 - 1 )) iflag=direct 2>/dev/null \
      || bad "cannot read the last block after the resize"
  else
    bad "resize: the disk has $(cat $B/size) sectors, not $P_resize_sectors"
  fi
fi

if [ "${P_migrate:-0}" = 1 ]; then   # live migration while every vCPU writes and verifies
  FLAG=$(( P_migrate_flag_mb * 256 ))   # in 4 KiB blocks: the host writes "migrated" there
  migrated() { dd if=/dev/$DEV bs=4k skip=$FLAG count=1 iflag=direct 2>/dev/null | grep -q migrated; }
  migrated && bad "the migration flag is set before the migration"
  FIOPID=""
  if [ -x /usr/bin/fio ] && [ "${P_fio:-0}" = 1 ]; then   # requests in flight at depth 32
    fio --name=migrate --filename=/dev/$DEV --thread --ioengine=libaio --direct=1 --rw=randwrite \
        --bs=4k --iodepth=32 --offset=$((T + 8))M --size=4M --verify=crc32c --verify_fatal=1 \
        --time_based --runtime=3600 > /tmp/fio-mig.out 2>&1 &
    FIOPID=$!
  fi
  say "migrate now"
  r=0
  while [ $r -lt 2000 ]; do
    c=0; pids=""
    while [ $c -lt $NC ]; do
      ( o=$(( (T + c) * 16 )); dd if=/dev/urandom of=/tmp/m$c bs=64k count=16 2>/dev/null
        dd if=/tmp/m$c of=/dev/$DEV bs=64k seek=$o count=16 oflag=direct conv=notrunc 2>/dev/null &&
        [ "$(dd if=/dev/$DEV bs=64k skip=$o count=16 iflag=direct 2>/dev/null | sha)" = "$(sha </tmp/m$c)" ] ) &
      pids="$pids $!"; c=$((c+1))
    done
    for p in $pids; do wait $p || bad "migration round $r: data read back differs"; done
    r=$((r+1))
    migrated && break
  done
  if [ -n "$FIOPID" ]; then
    kill -INT $FIOPID; wait $FIOPID
    if grep -q 'err= 0' /tmp/fio-mig.out && ! grep -qi 'verify: bad' /tmp/fio-mig.out; then
      say "migrate_fio_qd32 $(grep -m1 -E '^ *write: IOPS' /tmp/fio-mig.out | sed 's/^ *//')"
    else
      cat /tmp/fio-mig.out; bad "fio at depth 32 failed across the migration"
    fi
  fi
  migrated && say "migrate_rw=ok rounds=$r (on the destination now)" || bad "no migration after $r rounds"
fi

[ "${P_hold:-0}" = 1 ] && { say "hold: dropping to a shell"; setsid cttyhack sh; }
finish
GUESTINIT
}

# -------------------------------------------------------------- initramfs --
build_initramfs() {
  local root=$RUN/initramfs m
  rm -rf "$root"; mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
  cp "$BUSYBOX" "$root/bin/busybox"; ln -s busybox "$root/bin/sh"
  mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true   # /init copes without it (non-root)
  MOD_ORDER=()
  for m in virtio_pci virtio_blk; do add_module "$m"; done
  [ $SCSI = 1 ] && { add_module virtio_scsi; add_module sd_mod; }
  [ "$MODE" = nbd-kernel ] && { add_module virtio_net; add_module nbd; }
  for m in "${MOD_ORDER[@]}"; do cp "$(mod_path "$m")" "$root/lib/modules/"; done
  printf '%s\n' "${MOD_ORDER[@]}" > "$root/lib/modules/load-order"
  write_guest_init "$root/init"; chmod 755 "$root/init"
  mk_cpio "$root" | gzip -1 > "$RUN/initrd.img"
  # Extra programs go into separately cached cpio archives appended to the initrd
  # (the kernel unpacks concatenated archives); left uncompressed = faster under TCG.
  # An uncompressed cpio is only recognised at a 4-byte aligned offset: zero-pad the
  # gzip part (the kernel skips zero bytes between archives).
  truncate -s %4 "$RUN/initrd.img"
  if [ $FIO = 1 ]; then
    local fc=$WORKDIR/cache/fio.cpio
    if [ ! -s "$fc" ] || [ "$fc" -ot "$(command -v fio)" ]; then
      mkdir -p "$WORKDIR/cache"; rm -rf "$fc.root"
      copy_with_libs "$fc.root" "" "$(command -v fio)" ""
      mk_cpio "$fc.root" > "$fc.tmp" && mv "$fc.tmp" "$fc"; rm -rf "$fc.root"
    fi
    cat "$fc" >> "$RUN/initrd.img"
  fi
  if [ "$MODE" = nbd-kernel ]; then
    local nc=$WORKDIR/cache/nbd-client.cpio x1 x2
    if [ ! -s "$nc" ]; then
      # nbd-client is not installed on the host: take it (and libnl-genl, which the
      # host lacks) from Debian packages; the other libraries come from the host.
      x1=$(extract_deb "$(fetch_deb nbd-client)"); x2=$(extract_deb "$(fetch_deb libnl-genl-3-200)")
      mkdir -p "$WORKDIR/cache"; rm -rf "$nc.root"
      copy_with_libs "$nc.root" "$x2" "$x1/sbin/nbd-client" "$x2/lib/x86_64-linux-gnu"
      mk_cpio "$nc.root" > "$nc.tmp" && mv "$nc.tmp" "$nc"; rm -rf "$nc.root"
    fi
    cat "$nc" >> "$RUN/initrd.img"
  fi
}

# ------------------------------------------------------------------ server --
port_listening() {
  if command -v ss >/dev/null; then ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
  else (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; fi
}
start_server() {
  local cmd=$SERVER_CMD bd i
  if [ "$MODE" = nbd-kernel ]; then
    for i in $(seq 50); do NBD_PORT=$(( 20000 + RANDOM % 20000 )); port_listening "$NBD_PORT" || break; done
  fi
  export VMTEST_SOCK=$SOCK VMTEST_SOCK2=$SOCK.dst VMTEST_NBD_HOST=$NBD_HOST VMTEST_NBD_PORT=$NBD_PORT VMTEST_IMG=$IMG \
         VMTEST_SIZE_MB=$DISK_MB VMTEST_NUM_QUEUES=$NUM_QUEUES VMTEST_MODE=$MODE VMTEST_EXPORT=$NBD_EXPORT
  if [ -z "$cmd" ]; then
    bd='--blockdev driver=file,node-name=file0,filename="$VMTEST_IMG" --blockdev driver=raw,node-name=disk0,file=file0'
    case "$MODE" in
      vhost) cmd="exec qemu-storage-daemon $bd --export type=vhost-user-blk,id=exp0,node-name=disk0,addr.type=unix,addr.path=\"\$VMTEST_SOCK\",writable=on,num-queues=\$VMTEST_NUM_QUEUES" ;;
      nbd)   cmd="exec qemu-storage-daemon $bd --nbd-server addr.type=unix,addr.path=\"\$VMTEST_SOCK\" --export type=nbd,id=exp0,node-name=disk0,name=\"\$VMTEST_EXPORT\",writable=on" ;;
      nbd-kernel) cmd="exec qemu-storage-daemon $bd --nbd-server addr.type=inet,addr.host=\$VMTEST_NBD_HOST,addr.port=\$VMTEST_NBD_PORT --export type=nbd,id=exp0,node-name=disk0,name=\"\$VMTEST_EXPORT\",writable=on" ;;
    esac
  fi
  log "server: $cmd"
  [ -n "$SOCK" ] && rm -f "$SOCK"
  # own session + process group, so cleanup can stop everything the command spawned
  setsid bash -c "$cmd" </dev/null >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  for i in $(seq 300); do
    if [ -n "$HOTPLUG_CMD" ]; then [ -S "$SOCK.qmp" ] && return 0
    elif [ -n "$LUN_CMD" ]; then [ -S "$SOCK" ] && [ -S "$SOCK.qmp" ] && return 0
    elif [ $MIGRATE = 1 ]; then [ -S "$SOCK" ] && [ -S "$SOCK.dst" ] && return 0
    elif [ -n "$SOCK" ]; then [ -S "$SOCK" ] && return 0; else port_listening "$NBD_PORT" && return 0; fi
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$SERVER_LOG" >&2; die "server exited before listening"; }
    sleep 0.1
  done
  cat "$SERVER_LOG" >&2; die "server not listening on ${SOCK:-port $NBD_PORT} after 30s"
}

# -------------------------------------------------------------------- main --
get_kernel
build_initramfs
log "kernel $KDEB_NAME, modules: ${MOD_ORDER[*]}, initrd $(du -h "$RUN/initrd.img" | cut -f1)"

SEED_SHA=""
if [ $EXTERNAL = 0 ]; then
  truncate -s "${DISK_MB}M" "$IMG"
  if [ $SEED = 1 ]; then
    head -c $((SEED_MB * 1048576)) /dev/urandom > "$RUN/seed.bin"
    dd if="$RUN/seed.bin" of="$IMG" bs=1M seek=$((DISK_MB - SEED_MB)) conv=notrunc status=none
    SEED_SHA=$(sha256sum < "$RUN/seed.bin" | cut -d' ' -f1)
  fi
  start_server
  [ $IMAGE_CHECKS = 1 ] && IMAGE=$IMG
elif [ -n "$SOCKET" ] && [ ! -S "$SOCKET" ]; then
  die "$SOCKET is not a socket"
fi

if [ "$MODE" = nbd-kernel ]; then EXPQ=$NUM_QUEUES; else EXPQ=$(( NUM_QUEUES < SMP ? NUM_QUEUES : SMP )); fi
APPEND="console=ttyS0 panic=-1 rdinit=/init mitigations=off"
[ $VERBOSE = 1 ] || APPEND="$APPEND quiet"
APPEND="$APPEND vmtest.test_mb=$TEST_MB vmtest.perf_mb=$PERF_MB vmtest.perf4k_mb=$PERF4K_MB vmtest.span_mb=$PERF_SPAN vmtest.expect_queues=$EXPQ"
[ -n "$SEED_SHA" ] && APPEND="$APPEND vmtest.seed_mb=$SEED_MB vmtest.seed_sha=$SEED_SHA"
[ $DISCARD_ZERO = 1 ] && APPEND="$APPEND vmtest.discard_zero=1"
[ $FLUSH_REQUIRED = 1 ] && APPEND="$APPEND vmtest.flush_required=1"
[ $FIO = 1 ] && APPEND="$APPEND vmtest.fio=1 vmtest.fio_runtime=$FIO_RUNTIME vmtest.fio_mb=16"
[ -n "$HOTPLUG_CMD" ] && APPEND="$APPEND vmtest.hotplug=1"
[ $SCSI = 1 ] && APPEND="$APPEND vmtest.scsi=1"
[ "$SCSI_LUNS" -gt 0 ] && APPEND="$APPEND vmtest.scsi_luns=$SCSI_LUNS"
[ -n "$LUN_CMD" ] && APPEND="$APPEND vmtest.scsi_hotlun=1"
[ "$RESIZE_MB" -gt 0 ] && APPEND="$APPEND vmtest.resize_sectors=$((RESIZE_MB * 2048))"
[ $MIGRATE = 1 ] && APPEND="$APPEND vmtest.migrate=1 vmtest.migrate_flag_mb=$((DISK_MB - SEED_MB - MIGRATE_FLAG_MB))"

QEMU=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp "$SMP" -m "${MEM_MB}M"
  # vhost-user needs guest RAM in shared memory (memfd, share=on) that the server can mmap
  -object "memory-backend-memfd,id=mem,size=${MEM_MB}M,share=on" -machine pc,memory-backend=mem
  -kernel "$VMLINUZ" -initrd "$RUN/initrd.img"
  -nodefaults -display none -serial stdio -no-reboot -pidfile "$RUN/qemu.pid")
case "$MODE" in
  vhost)
    if [ -n "$HOTPLUG_CMD" ]; then    # the disk comes later, through QEMU's monitor
      QEMU+=(-qmp "unix:$RUN/qemu.qmp,server=on,wait=off")
    elif [ $MIGRATE = 1 ]; then       # the destination gets the same, on the second socket
      QEMU+=(-qmp "unix:$RUN/qemu.qmp,server=on,wait=off"
             -chardev "socket,id=vu0,path=$SOCK"
             -device "vhost-user-blk-pci,chardev=vu0,num-queues=$NUM_QUEUES${DEVICE_OPTS:+,$DEVICE_OPTS}")
    elif [ $SCSI = 1 ]; then
      QEMU+=(-chardev "socket,id=vu0,path=$SOCK"
             -device "vhost-user-scsi-pci,chardev=vu0,num_queues=$NUM_QUEUES${DEVICE_OPTS:+,$DEVICE_OPTS}")
    else
      QEMU+=(-chardev "socket,id=vu0,path=$SOCK"
             -device "vhost-user-blk-pci,chardev=vu0,num-queues=$NUM_QUEUES${DEVICE_OPTS:+,$DEVICE_OPTS}")
    fi ;;
  nbd)
    if [ -n "$NBD_TCP" ]; then
      QEMU+=(-blockdev "driver=nbd,node-name=nbd0,server.type=inet,server.host=$NBD_HOST,server.port=$NBD_PORT,export=$NBD_EXPORT")
    else
      QEMU+=(-blockdev "driver=nbd,node-name=nbd0,server.type=unix,server.path=$SOCK,export=$NBD_EXPORT")
    fi
    QEMU+=(-device "virtio-blk-pci,drive=nbd0,num-queues=$NUM_QUEUES${DEVICE_OPTS:+,$DEVICE_OPTS}") ;;
  nbd-kernel)
    # slirp: the guest reaches the host's 127.0.0.1 as 10.0.2.2
    GHOST=$NBD_HOST; case "$GHOST" in 127.*|localhost) GHOST=10.0.2.2 ;; esac
    QEMU+=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=)
    APPEND="$APPEND vmtest.dev=nbd0 vmtest.nbd_host=$GHOST vmtest.nbd_port=$NBD_PORT vmtest.nbd_export=$NBD_EXPORT vmtest.nbd_conns=$NUM_QUEUES" ;;
esac
QEMU+=(-append "$APPEND" ${QEMU_EXTRA[@]+"${QEMU_EXTRA[@]}"})
if [ $MIGRATE = 1 ]; then
  QEMU2=()
  for a in "${QEMU[@]}"; do
    case "$a" in
      "socket,id=vu0,path=$SOCK") a="socket,id=vu0,path=$SOCK.dst" ;;
      "unix:$RUN/qemu.qmp,server=on,wait=off") a="unix:$RUN/qemu2.qmp,server=on,wait=off" ;;
      "$RUN/qemu.pid") a="$RUN/qemu2.pid" ;;
    esac
    QEMU2+=("$a")
  done
  QEMU2+=(-incoming "unix:$RUN/migrate.sock")
fi
printf '%q ' "${QEMU[@]}" > "$RUN/qemu-cmd.txt"; echo >> "$RUN/qemu-cmd.txt"
log "qemu: $(cat "$RUN/qemu-cmd.txt")"

# If we started the server and it exits before the guest printed its result, stop
# QEMU at once instead of waiting for --timeout (guest I/O would just hang).
watch_server() {
  local qp
  while sleep 1; do
    [ -s "$RUN/qemu.pid" ] || continue
    qp=$(cat "$RUN/qemu.pid" 2>/dev/null) || continue
    kill -0 "$qp" 2>/dev/null || return 0
    if ! kill -0 "$SERVER_PID" 2>/dev/null && ! grep -q 'VMTEST: RESULT' "$CONSOLE_LOG" 2>/dev/null; then
      touch "$RUN/server-died"; kill -TERM "$qp" 2>/dev/null; return 0
    fi
  done
}
if [ -n "$SERVER_PID" ]; then watch_server & WATCH_PID=$!; fi

# Run the guest; prefix every console line with host seconds since QEMU start.
# (In the background + wait, so that INT/TERM reach our trap, which stops QEMU.)
# run_guest [2]: the source QEMU (console.log, qemu.rc), or with 2 the migration's
# destination (console2.log, qemu2.rc).
run_guest() {
  local n=${1:-} cmd
  set +e
  if [ -n "$n" ]; then cmd=("${QEMU2[@]}"); else cmd=("${QEMU[@]}"); fi
  timeout -k 10 "$TIMEOUT" "${cmd[@]}" </dev/null 2>&1 | while IFS= read -r line; do
    line=${line%$'\r'}
    ms=$(( (${EPOCHREALTIME/./} - T0) / 1000 ))
    printf '[host %4d.%03d] %s\n' $((ms / 1000)) $((ms % 1000)) "$line"
  done | tee "$RUN/console$n.log"
  echo "${PIPESTATUS[0]}" > "$RUN/qemu$n.rc"
}
T0=${EPOCHREALTIME/./}
DEST_PID=""
if [ $MIGRATE = 1 ]; then
  run_guest 2 > /dev/null & DEST_PID=$!
  for i in $(seq 300); do [ -S "$RUN/qemu2.qmp" ] && break; sleep 0.1; done
  ( export VMTEST_QEMU_QMP=$RUN/qemu.qmp VMTEST_QEMU2_QMP=$RUN/qemu2.qmp VMTEST_CONSOLE=$CONSOLE_LOG \
      VMTEST_IMG=$IMG VMTEST_FLAG_OFFSET=$(( (DISK_MB - SEED_MB - MIGRATE_FLAG_MB) * 1048576 )) \
      VMTEST_SERVER_PID=$SERVER_PID VMTEST_QEMU_PID_FILE=$RUN/qemu.pid
    rc=0; python3 "$(dirname "${BASH_SOURCE[0]}")/vm-migrate.py" "unix:$RUN/migrate.sock" \
      >"$RUN/migrate.log" 2>&1 || rc=$?; echo $rc >"$RUN/migrate.rc"
    # A failed migration leaves the guest looping on the source: stop it now.
    if [ $rc != 0 ]; then kill -TERM "$(cat "$RUN/qemu.pid" 2>/dev/null)" 2>/dev/null || true; fi ) &
  MIGRATE_PID=$!
fi
run_guest & GUEST_PID=$!
if [ -n "$LUN_CMD" ]; then
  ( export VMTEST_CONSOLE=$CONSOLE_LOG
    rc=0; bash -c "$LUN_CMD" >"$RUN/lun.log" 2>&1 || rc=$?; echo $rc >"$RUN/lun.rc" ) &
  LUN_PID=$!
fi
if [ -n "$HOTPLUG_CMD" ]; then
  ( export VMTEST_QEMU_QMP=$RUN/qemu.qmp VMTEST_CONSOLE=$CONSOLE_LOG
    rc=0; bash -c "$HOTPLUG_CMD" >"$RUN/hotplug.log" 2>&1 || rc=$?; echo $rc >"$RUN/hotplug.rc" ) &
  HOTPLUG_PID=$!
fi
wait "$GUEST_PID" || true
if [ -n "$HOTPLUG_CMD" ]; then wait "$HOTPLUG_PID" 2>/dev/null || true; fi
if [ -n "$LUN_CMD" ]; then wait "$LUN_PID" 2>/dev/null || true; fi
if [ $MIGRATE = 1 ]; then
  wait "$MIGRATE_PID" 2>/dev/null || true
  # Without a completed migration the destination only waits: stop it.
  if [ "$(cat "$RUN/migrate.rc" 2>/dev/null)" != 0 ]; then
    kill "$(cat "$RUN/qemu2.pid" 2>/dev/null)" 2>/dev/null || true
  fi
  wait "$DEST_PID" || true
  cat "$RUN/console2.log" >> "$CONSOLE_LOG" 2>/dev/null || true
fi
GUEST_PID=""
QRC=$(cat "$RUN/qemu.rc" 2>/dev/null || echo 255)
if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null || true; wait "$WATCH_PID" 2>/dev/null || true; WATCH_PID=""; fi
WALL_MS=$(( (${EPOCHREALTIME/./} - T0) / 1000 ))

# ----------------------------------------------------------------- verdict --
FAIL=""
[ "$QRC" = 124 ] && FAIL="$FAIL guest-timeout(${TIMEOUT}s)"
[ -e "$RUN/server-died" ] && FAIL="$FAIL server-exited-during-test"
if [ -n "$HOTPLUG_CMD" ] && [ "$(cat "$RUN/hotplug.rc" 2>/dev/null)" != 0 ]; then
  FAIL="$FAIL hotplug-cmd-failed"; echo "--- hotplug log ---"; cat "$RUN/hotplug.log"
fi
if [ -n "$LUN_CMD" ] && [ "$(cat "$RUN/lun.rc" 2>/dev/null)" != 0 ]; then
  FAIL="$FAIL lun-cmd-failed"; echo "--- lun log ---"; cat "$RUN/lun.log"
fi
[ "$QRC" != 0 ] && [ "$QRC" != 124 ] && [ ! -e "$RUN/server-died" ] && FAIL="$FAIL qemu-exit-$QRC"
if [ $MIGRATE = 1 ]; then
  [ "$(cat "$RUN/migrate.rc" 2>/dev/null)" = 0 ] || FAIL="$FAIL migration-failed"
  Q2=$(cat "$RUN/qemu2.rc" 2>/dev/null || echo 255)
  [ "$Q2" = 0 ] || FAIL="$FAIL destination-qemu-exit-$Q2"
  echo "--- migration log ---"; cat "$RUN/migrate.log"
fi
RES=$(grep -m1 'VMTEST: RESULT' "$CONSOLE_LOG" || true)
case "$RES" in *"RESULT PASS"*) ;; *) FAIL="$FAIL guest:${RES#*VMTEST: }"; [ -z "$RES" ] && FAIL="$FAIL(no result line)";; esac

HOSTCHK="skipped"
PSHA=$(sed -n 's/.*VMTEST: pattern_sha256=\([0-9a-f]*\).*/\1/p' "$CONSOLE_LOG" | head -1)
if [ -n "$IMAGE" ] && [ $IMAGE_CHECKS = 1 ] && [ -n "$PSHA" ]; then
  # what the guest wrote (O_DIRECT + FLUSH) must be in the server's backing file
  h=$(dd if="$IMAGE" bs=1M count="$TEST_MB" status=none | sha256sum | cut -d' ' -f1)
  if [ "$h" = "$PSHA" ]; then HOSTCHK=ok; else HOSTCHK="MISMATCH"; FAIL="$FAIL host-image-mismatch"; fi
  if [ -n "$SEED_SHA" ]; then
    h=$(dd if="$IMAGE" bs=1M skip=$((DISK_MB - SEED_MB)) count=$SEED_MB status=none | sha256sum | cut -d' ' -f1)
    [ "$h" = "$SEED_SHA" ] || { HOSTCHK="$HOSTCHK, seed-region-CHANGED"; FAIL="$FAIL seed-region-overwritten"; }
  fi
fi

PASS_AT=$(sed -n 's/^\[host *\([0-9.]*\)\] VMTEST: RESULT PASS.*/\1/p' "$CONSOLE_LOG" | head -1)
echo "==================== run-vm-test summary ===================="
echo "mode=$MODE num_queues=$NUM_QUEUES smp=$SMP mem=${MEM_MB}M kernel=$KDEB_NAME"
if [ $EXTERNAL = 1 ]; then echo "server: external ${SOCKET:-$NBD_TCP}"; else echo "server: ${SERVER_CMD:-qemu-storage-daemon} (pid $SERVER_PID)"; fi
grep -E 'VMTEST: (scsi|lun |hotlun|resize|migrate_|guest_queues|queue |virtio_features|disk_mb|cache_type|io_stats|irq |seed_check|serial_rw|parallel_rw|discard|perf |fio_|nbd|WARN|ERROR)' "$CONSOLE_LOG" \
  | sed 's/^\[host *[0-9.]*\] VMTEST: /  /' || true
echo "  host_image_check=$HOSTCHK"
echo "  qemu_wall_s=$((WALL_MS / 1000)).$(printf %03d $((WALL_MS % 1000))) boot_to_result_s=${PASS_AT:-n/a} (host clock, from QEMU start)"
if [ -z "$FAIL" ]; then echo "RESULT: PASS"; exit 0; fi
echo "RESULT: FAIL ($FAIL )"
if [ -s "$SERVER_LOG" ]; then echo "--- server log (tail) ---"; tail -20 "$SERVER_LOG"; fi
exit 1
