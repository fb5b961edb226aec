#!/usr/bin/env python3
"""Hostile qcow2 images for the functional tests and the fuzz crashers: each is a small
image made by qemu-img (4 KiB clusters, 1 MiB, guest clusters 0 and 1 written) with
header fields, tables, entries or extensions patched.

  header   (test-img-hostile.sh) an offset + length taken from the image wraps, points
           outside the file, or claims far more than the file holds;
  overlap  (test-img-overlap.sh) a data cluster or an L2 table is other metadata;
  size     (test-img-check-bounds.sh) tables whose entries all name one refcount block,
           one L2 table or one snapshot L1 table claim far more than the file holds
           (64 KiB clusters; the -huge ones are 33 MiB or more, made at test time).

    _qcow2craft.py list GROUP        names of a group, one a line
    _qcow2craft.py NAME OUT          write image NAME to OUT (qemu-img must be installed)
"""
import os
import struct
import subprocess
import sys
import tempfile

CS = 4096
U64 = (1 << 64) - 1


def qemu_image(path, size='1M', opts='', writes=(), cs=CS):
    o = 'cluster_size=%d' % cs + (',' + opts if opts else '')
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o', o, path, size], check=True)
    args = []
    for w in writes:
        args += ['-c', w]
    if args:
        subprocess.run(['qemu-io', '-f', 'qcow2'] + args + [path], check=True,
                       stdout=subprocess.DEVNULL)
    return bytearray(open(path, 'rb').read())


def be64(d, off):
    return struct.unpack_from('>Q', d, off)[0]


def put64(d, off, v):
    struct.pack_into('>Q', d, off, v & U64)


def put32(d, off, v):
    struct.pack_into('>I', d, off, v & 0xffffffff)


def add_ext(d, ext_type, payload):
    """Insert a header extension right after the header (before the end marker)."""
    hlen = struct.unpack_from('>I', d, 100)[0]
    pos = hlen
    while True:
        t, ln = struct.unpack_from('>II', d, pos)
        if t == 0:
            break
        pos += 8 + (ln + 7) // 8 * 8
    raw = struct.pack('>II', ext_type, len(payload)) + payload
    raw += b'\0' * ((8 - len(raw) % 8) % 8)
    d[pos:pos + len(raw)] = raw
    d[pos + len(raw):pos + len(raw) + 8] = b'\0' * 8


def grow(d, n=CS, align=CS):
    """Append n zero bytes at the next multiple of align; returns their offset."""
    d.extend(b'\0' * (-len(d) % align))
    off = len(d)
    d.extend(b'\0' * n)
    return off


def snapshot_entry(l1_off, l1_size, extra=16, id_len=1, name_len=1):
    e = struct.pack('>QIHHIIQII', l1_off, l1_size, id_len, name_len, 0, 0, 0, 0, extra)
    return e + b'\0' * extra + b'1' * id_len + b's' * name_len


def with_snapshots(d, entries, count=None):
    """Put a snapshot table in a new cluster at the end; count overrides nb_snapshots."""
    off = grow(d, CS)
    tab = b''.join(e + b'\0' * ((8 - len(e) % 8) % 8) for e in entries)
    d[off:off + len(tab)] = tab[:CS]
    put32(d, 60, len(entries) if count is None else count)
    put64(d, 64, off)


def case_backing_offset_wrap(d):
    put64(d, 8, U64 - 99)  # offset + 200 wraps to 100
    put32(d, 16, 200)


def case_backing_offset_past_cluster(d):
    put64(d, 8, CS + 8)
    put32(d, 16, 8)


def case_header_ext_length_wrap(d):
    add_ext(d, 0x12345678, b'')
    hlen = struct.unpack_from('>I', d, 100)[0]
    put32(d, hlen + 4, 0xfffffff8)


def case_header_length_huge(d):
    put32(d, 100, 0xfffffff8)


def case_l1_offset_wrap(d):
    put64(d, 40, U64 + 1 - 2 * CS)


def case_l1_size_huge(d):
    put32(d, 36, 0xffffffff)


def case_rct_offset_wrap(d):
    put64(d, 48, U64 + 1 - CS)


def case_rct_clusters_huge(d):
    put32(d, 56, 0xffffffff)


def bitmaps_ext(d, nb, dir_size, dir_off):
    put64(d, 88, be64(d, 88) | 1)  # autoclear: bitmaps
    add_ext(d, 0x23852875, struct.pack('>IIQQ', nb, 0, dir_size, dir_off))


def case_bitmaps_dir_wrap(d):
    bitmaps_ext(d, 1, 2 * CS, U64 + 1 - CS)


def case_bitmaps_dir_huge(d):
    bitmaps_ext(d, 1, 1 << 63, CS)


def case_bitmaps_dir_past_eof(d):
    bitmaps_ext(d, 1, 1 << 20, 2 * CS)


def case_bitmaps_count_huge(d):
    bitmaps_ext(d, 0xffffffff, CS, 2 * CS)


def case_bitmaps_ext_short(d):
    put64(d, 88, be64(d, 88) | 1)
    add_ext(d, 0x23852875, struct.pack('>IIQ', 1, 0, CS))


def case_snapshot_count_huge(d):
    with_snapshots(d, [snapshot_entry(0, 0)], count=65536)


def case_snapshot_extra_huge(d):
    e = bytearray(snapshot_entry(0, 0))
    put32(e, 36, 0xffffffff)
    with_snapshots(d, [bytes(e)])


def case_snapshot_names_past_eof(d):
    e = bytearray(snapshot_entry(0, 0))
    struct.pack_into('>HH', e, 12, 0xffff, 0xffff)
    with_snapshots(d, [bytes(e)])


def case_snapshot_l1_wrap(d):
    with_snapshots(d, [snapshot_entry(U64 + 1 - CS, 1024)])


def case_snapshot_l1_huge(d):
    with_snapshots(d, [snapshot_entry(CS, 0xffffffff)])


def case_data_file_name_long(d):
    put64(d, 72, be64(d, 72) | 4)  # incompatible: external data file
    add_ext(d, 0x44415441, b'x' * 2000)


def case_crypto_ext(d):
    add_ext(d, 0x0537be77, struct.pack('>QQ', U64 + 1 - CS, 2 * CS))


def case_feature_table_huge(d):
    add_ext(d, 0x6803f857, b'')
    hlen = struct.unpack_from('>I', d, 100)[0]
    put32(d, hlen + 4, 0xffffff00)


# ---- overlap: guest data or metadata on other metadata ----

COPIED = 1 << 63


def layout(d):
    """Offsets of the L1 table, refcount table, first refcount block and L2 table."""
    l1, rct = be64(d, 40), be64(d, 48)
    return l1, rct, be64(d, rct), be64(d, l1) & 0x00fffffffffffe00


def case_data_on_l2(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l2, l2 | COPIED)


def case_data_on_rb(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l2, rb | COPIED)


def case_data_on_l1(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l2, l1 | COPIED)


def case_zero_on_rb(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l2, rb | COPIED | 1)


def case_l2_on_rb(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l1, rb | COPIED)


def case_data_on_snapshot_l1(d):
    l1, rct, rb, l2 = layout(d)
    put64(d, l2, be64(d, be64(d, 64)) | COPIED)


OVERLAP = {
    'data-on-l2': case_data_on_l2,
    'data-on-rb': case_data_on_rb,
    'data-on-l1': case_data_on_l1,
    'zero-on-rb': case_zero_on_rb,
    'l2-on-rb': case_l2_on_rb,
    'data-on-snapshot-l1': case_data_on_snapshot_l1,
}

# qemu-io commands run on the base image before the patch, per case.
SETUP = {
    # a snapshot, then cluster 0 rewritten: the active image has its own L2 table
    'data-on-snapshot-l1': ['write -P 0x6b 0 4k'],
}

HEADER = {
    'backing-offset-wrap': case_backing_offset_wrap,
    'backing-offset-past-cluster': case_backing_offset_past_cluster,
    'header-ext-length-wrap': case_header_ext_length_wrap,
    'header-length-huge': case_header_length_huge,
    'l1-offset-wrap': case_l1_offset_wrap,
    'l1-size-huge': case_l1_size_huge,
    'rct-offset-wrap': case_rct_offset_wrap,
    'rct-clusters-huge': case_rct_clusters_huge,
    'bitmaps-dir-wrap': case_bitmaps_dir_wrap,
    'bitmaps-dir-huge': case_bitmaps_dir_huge,
    'bitmaps-dir-past-eof': case_bitmaps_dir_past_eof,
    'bitmaps-count-huge': case_bitmaps_count_huge,
    'bitmaps-ext-short': case_bitmaps_ext_short,
    'snapshot-count-huge': case_snapshot_count_huge,
    'snapshot-extra-huge': case_snapshot_extra_huge,
    'snapshot-names-past-eof': case_snapshot_names_past_eof,
    'snapshot-l1-wrap': case_snapshot_l1_wrap,
    'snapshot-l1-huge': case_snapshot_l1_huge,
    'data-file-name-long': case_data_file_name_long,
    'crypto-ext': case_crypto_ext,
    'feature-table-huge': case_feature_table_huge,
}

# ---- size: claims far beyond the file ----

CS64 = 65536


def base64k(tmp, opts='', writes=('write -P 0x11 0 1M',)):
    return qemu_image(os.path.join(tmp, 'b.qcow2'), '1G', opts, writes, CS64)


def rct_all_first(d):
    """Every refcount table entry names the first refcount block."""
    rct, n = be64(d, 48), struct.unpack_from('>I', d, 56)[0] * CS64 // 8
    rb = be64(d, rct)
    for i in range(n):
        put64(d, rct + 8 * i, rb)


def size_rb_alias(tmp):
    d = base64k(tmp)
    rct_all_first(d)
    return d


def size_rb_alias_rc1(tmp):
    """1-bit refcounts: the 8192 entries claim 2^32 clusters (256 TiB)."""
    d = base64k(tmp, 'refcount_bits=1', ())
    rct_all_first(d)
    return d


def l1_all_first(d, entries):
    """A new L1 table of entries entries, all naming the first L2 table."""
    e = be64(d, be64(d, 40))
    off = grow(d, (entries * 8 + CS64 - 1) // CS64 * CS64, CS64)
    d[off:off + entries * 8] = struct.pack('>Q', e) * entries
    put64(d, 40, off)
    put32(d, 36, entries)


def size_l1_alias(tmp):
    d = base64k(tmp)
    l1_all_first(d, 65536)
    return d


def size_l1_alias_huge(tmp):
    d = base64k(tmp)
    l1_all_first(d, (32 << 20) // 8)  # the largest L1 table
    return d


def snapshots_all_first(tmp, count, l1_entries=0):
    """count snapshots, all with the L1 table of the first (made by qemu-img)."""
    d = base64k(tmp)
    base = os.path.join(tmp, 'b.qcow2')
    subprocess.run(['qemu-img', 'snapshot', '-c', 's1', base], check=True)
    d = bytearray(open(base, 'rb').read())
    tab = be64(d, 64)
    l1, l1_size = be64(d, tab), struct.unpack_from('>I', d, tab + 8)[0]
    if l1_entries:
        l1_all_first(d, l1_entries)  # the active one; the snapshots share a copy
        l1, l1_size = grow(d, l1_entries * 8, CS64), l1_entries
        d[l1:l1 + l1_entries * 8] = d[be64(d, 40):be64(d, 40) + l1_entries * 8]
    e = snapshot_entry(l1, l1_size)
    e += b'\0' * ((8 - len(e) % 8) % 8)
    off = grow(d, (len(e) * count + CS64 - 1) // CS64 * CS64, CS64)
    d[off:off + len(e) * count] = e * count
    put32(d, 60, count)
    put64(d, 64, off)
    return d


def size_snap_alias(tmp):
    return snapshots_all_first(tmp, 2000)


def size_snap_alias_huge(tmp):
    return snapshots_all_first(tmp, 65536, (32 << 20) // 8)


SIZE = {
    'rb-alias': size_rb_alias,
    'rb-alias-rc1': size_rb_alias_rc1,
    'l1-alias': size_l1_alias,
    'l1-alias-huge': size_l1_alias_huge,
    'snap-alias': size_snap_alias,
    'snap-alias-huge': size_snap_alias_huge,
}

CASES = dict(HEADER, **OVERLAP)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == 'list':
        print('\n'.join({'header': HEADER, 'overlap': OVERLAP, 'size': SIZE}[sys.argv[2]]))
        return 0
    if len(sys.argv) != 3 or (sys.argv[1] not in CASES and sys.argv[1] not in SIZE):
        print(__doc__, file=sys.stderr)
        return 2
    name = sys.argv[1]
    if name in SIZE:
        with tempfile.TemporaryDirectory() as tmp:
            open(sys.argv[2], 'wb').write(SIZE[name](tmp))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, 'base.qcow2')
        d = qemu_image(base, writes=['write -P 0x5a 0 8k'])
        if name in SETUP:
            subprocess.run(['qemu-img', 'snapshot', '-c', 's1', base], check=True)
            args = sum((['-c', c] for c in SETUP[name]), [])
            subprocess.run(['qemu-io', '-f', 'qcow2'] + args + [base], check=True,
                           stdout=subprocess.DEVNULL)
            d = bytearray(open(base, 'rb').read())
    CASES[name](d)
    open(sys.argv[2], 'wb').write(d)
    return 0


if __name__ == '__main__':
    sys.exit(main())
