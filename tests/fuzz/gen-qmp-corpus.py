#!/usr/bin/env python3
"""Writes the seed corpus of the QMP fuzz target (tests/fuzz/corpus-qmp/).

Each file is one client's byte stream after a first byte that tells fuzz-qmp.c how to
cut it into reads (bits 0-2) and whether output is pretty (bit 3). Streams negotiate and
run the built-in commands and the target's test commands (x-fuzz-args: a union with
lists, an alternate and every scalar type; x-fuzz-keyval: the same type from a keyval
string; x-fuzz-event; x-fuzz-later, which answers late) and the block-node commands on
null-co and raw nodes, plus the bad inputs the unit
and functional tests use: broken JSON, single quotes, control characters, deep nesting,
bad members, keyval errors. Deterministic and small.

    python3 tests/fuzz/gen-qmp-corpus.py [DIR]     (default: corpus-qmp/ next to it)
"""
import hashlib
import json
import os
import sys

NEG = b'{"execute":"qmp_capabilities"}'


def cmd(name, args=None, **extra):
    m = {'execute': name}
    if args is not None:
        m['arguments'] = args
    m.update(extra)
    return json.dumps(m).encode()


STREAMS = [
    NEG + cmd('query-version', id=1) + cmd('query-commands') + cmd('query-qmp-schema'),
    cmd('query-version') + NEG + NEG + cmd('quit'),
    cmd('qmp_capabilities', {'enable': ['oob']}) + cmd('qmp_capabilities', {'enable': [1]}),
    NEG + cmd('x-fuzz-args', {'kind': 'a', 'size': 4096, 'n': 7, 'ratio': 0.5, 'i8': -3,
                              'u64': -1, 'ints': [1, -2], 'enums': ['b', 'c'],
                              'inner': {'path': '/x', 'on': True}, 'null': None,
                              'any': [1, {'a': None}]}),
    NEG + cmd('x-fuzz-args', {'kind': 'b', 'file': {'kind': 'b', 'file': 'node'},
                              'list': [{'path': 'p'}]}),
    NEG + cmd('x-fuzz-args', {'kind': 'b'}) + cmd('x-fuzz-args', {'kind': 'z'}) +
    cmd('x-fuzz-args', {'kind': 'a', 'i8': 300}) + cmd('x-fuzz-args', {'kind': 'a', 'x': 1}) +
    cmd('x-fuzz-args', {'kind': 'b', 'file': 5}) + cmd('x-fuzz-args', {'kind': 'a', 'n': -1}),
    NEG + cmd('x-fuzz-keyval', {'arg': 'a,size=64k,n=0x10,flag=on,ints.0=1,ints.1=-2,'
                                       'enums.0=c,inner.path=/p,ratio=2.5'}),
    NEG + cmd('x-fuzz-keyval', {'arg': 'b,file.kind=a,file.size=1.5M,list.0.path=x,'
                                       'list.1.path=y,list.1.on=off'}),
    NEG + cmd('x-fuzz-keyval', {'arg': 'a,inner.path=x,inner=y'}) +
    cmd('x-fuzz-keyval', {'arg': 'a,ints.1=1'}) + cmd('x-fuzz-keyval', {'arg': 'a,,b'}) +
    cmd('x-fuzz-keyval', {'arg': '{"kind":"a","size":"1k"}'}) +
    cmd('x-fuzz-keyval', {'arg': 'help', 'implied': 'name'}),
    NEG + cmd('x-fuzz-event', {'name': 'SHUTDOWN', 'data': {'guest': False}}) +
    cmd('x-fuzz-later', id='l') + cmd('query-version', id='after'),
    NEG + b'{"execute":"query-version",}{"a":tru}{"a":1,"a":2}[]"s" 1 ]{}',
    NEG + b"{'execute':'query-version','id':'a\"b\\'c'}",
    NEG + b'{"execute": \x01{"execute":"query-version"}\xff{"execute":"quit"}',
    NEG + b'[' * 1100 + b']' * 1100 + b'{"execute":"query-version"}',
    NEG + b'{"foo":1}{"execute":1}{"execute":"query-version","arguments":[]}'
    b'{"exec-oob":"quit"}{"execute":"query-version","id":1,"control":{}}',
    NEG + b'{"execute":"query-\\u0076ersion","id":"\\u00e9\xc3\xa9"}{"a":"\\ud800"}'
    b'{"a":"\\u0000"}{"a":1e999}{"a":18446744073709551616}',
    # The block-node commands (null-co and raw only in the fuzz target).
    NEG + cmd('blockdev-add', {'driver': 'null-co', 'node-name': 'n0', 'size': 1048576}) +
    cmd('blockdev-add', {'driver': 'raw', 'node-name': 'r0', 'file': 'n0', 'offset': 512}) +
    cmd('blockdev-add', {'driver': 'raw', 'node-name': 'r1', 'read-only': True,
                         'file': {'driver': 'null', 'node-name': 'c1', 'read-zeroes': True},
                         'cache': {'direct': False, 'no-flush': True}}) +
    cmd('query-named-block-nodes', {'flat': True}) + cmd('query-named-block-nodes') +
    cmd('query-blockstats', {'query-nodes': True}) + cmd('query-blockstats') +
    cmd('blockdev-del', {'node-name': 'n0'}) + cmd('blockdev-del', {'node-name': 'c1'}) +
    cmd('blockdev-del', {'node-name': 'r0'}) + cmd('blockdev-del', {'node-name': 'n0'}),
    NEG + cmd('blockdev-add', {'driver': 'null-co', 'node-name': 'n0'}) +
    cmd('blockdev-add', {'driver': 'null-co', 'node-name': 'n0'}) +
    cmd('blockdev-add', {'driver': 'null-co'}) +
    cmd('blockdev-add', {'driver': 'file', 'node-name': 'f', 'filename': '/dev/null'}) +
    cmd('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'file': 'nope'}) +
    cmd('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'file': 7}) +
    cmd('blockdev-add', {'driver': 'raw', 'node-name': '1x', 'file': 'n0'}) +
    cmd('blockdev-add', {'driver': 'null-co', 'node-name': 'y', 'detect-zeroes': 'on'}) +
    cmd('block_resize', {'node-name': 'n0', 'size': 4096}) +
    cmd('block_resize', {'device': 'n0', 'size': -1}) + cmd('block_resize', {'size': 1}) +
    cmd('blockdev-del', {'node-name': 'nope'}) + cmd('blockdev-del', {}),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'corpus-qmp')
    os.makedirs(out, exist_ok=True)
    for i, s in enumerate(STREAMS):
        for head in (7, i % 7, 8 | (i % 8)):  # whole, cut into small reads, pretty
            data = bytes([head]) + s
            name = hashlib.sha1(data).hexdigest()
            with open(os.path.join(out, name), 'wb') as f:
                f.write(data)


if __name__ == '__main__':
    main()
