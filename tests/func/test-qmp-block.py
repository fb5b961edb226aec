"""The block-node commands side by side: one QMP script - blockdev-add (file, raw, qcow2,
null-co; children inline and by reference), blockdev-del, block_resize,
query-named-block-nodes, query-blockstats, and their error cases - runs against
qemu-storage-daemon and `ioplane serve`; their replies must have the same keys and types,
their errors the same class and text, and their effects (node lists, sizes on disk, image
sizes) must be the same. Bad input changes nothing."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _qmp  # noqa: E402

MiB = 1 << 20

# Keys qsd has that ioplane does not report (features ioplane lacks); ioplane may add
# only "x-ioplane".
QSD_ONLY = {'driver-specific', 'idle_time_ns', 'filename', 'backing-filename',
            'backing-filename-format', 'full-backing-filename'}
IOPLANE_ONLY = {'x-ioplane'}


def shape(v, path=''):
    """Keys and JSON types of a reply, as a set of 'path:type' strings (list elements
    are merged)."""
    out = set()
    t = type(v).__name__
    if isinstance(v, bool):
        t = 'bool'
    out.add('%s:%s' % (path, t))
    if isinstance(v, dict):
        for k, x in v.items():
            if k in IOPLANE_ONLY or k in QSD_ONLY:
                continue
            out |= shape(x, path + '.' + k)
    elif isinstance(v, list):
        for x in v:
            out |= shape(x, path + '[]')
    return out


def names(c):
    r = c.cmd('query-named-block-nodes')['return']
    return sorted(n['node-name'] for n in r if not n['node-name'].startswith('#'))


def script(tmp):
    """(command, arguments, how the replies are compared): 'exact' (the same reply),
    'shape' (keys and types), 'prefix:TEXT' (an error starting with TEXT on both)."""
    a, b, c, d = (os.path.join(tmp, n) for n in ('a.raw', 'b.raw', 'c.qcow2', 'd.raw'))
    file_a = {'driver': 'file', 'filename': a}
    return [
        ('blockdev-add', dict(file_a, **{'node-name': 'f0'}), 'exact'),
        ('blockdev-add', dict(file_a, **{'node-name': 'f0'}), 'exact'),  # duplicate
        ('blockdev-add', file_a, 'exact'),  # no node-name for the root
        ('blockdev-add', {'driver': 'raw', 'file': 'f0', 'node-name': 'r0'}, 'exact'),
        ('blockdev-del', {'node-name': 'f0'}, 'exact'),  # used by r0
        ('blockdev-del', {'node-name': 'nope'}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'r1',
                          'file': {'driver': 'file', 'filename': b, 'node-name': 'rf1'}},
         'exact'),
        ('blockdev-del', {'node-name': 'rf1'}, 'exact'),  # inline: not the monitor's
        ('blockdev-add', {'driver': 'bogus', 'node-name': 'x'}, 'exact'),
        ('blockdev-add', {'driver': 'file', 'node-name': 'x'}, 'exact'),
        ('blockdev-add', {'driver': 'file', 'node-name': 'x',
                          'filename': os.path.join(tmp, 'missing')}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'file': 'nope'}, 'exact'),
        ('blockdev-add', dict(file_a, **{'node-name': '1x'}), 'exact'),
        ('blockdev-add', dict(file_a, **{'node-name': 'x', 'bogus': 1}), 'exact'),
        ('blockdev-add', dict(file_a, **{'node-name': 'x', 'read-only': 'yes'}), 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'file': dict(file_a, **{
            'node-name': 'f0'})}, 'exact'),  # an inline child's duplicate name
        ('blockdev-add', {'driver': 'qcow2', 'node-name': 'q1', 'backing': None,
                          'file': {'driver': 'file', 'filename': c}}, 'exact'),
        ('blockdev-add', {'driver': 'qcow2', 'node-name': 'q2',
                          'file': {'driver': 'file', 'filename': c}},
         'prefix:Failed to get "write" lock'),
        ('blockdev-add', {'driver': 'null-co', 'node-name': 'n0', 'size': MiB,
                          'read-only': True, 'cache': {'direct': False, 'no-flush': True}},
         'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'dz', 'detect-zeroes': 'unmap',
                          'discard': 'unmap', 'file': {'driver': 'file', 'filename': d,
                                                       'node-name': 'dzf'}}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'detect-zeroes': 'maybe',
                          'file': 'dzf'}, 'exact'),
        ('query-named-block-nodes', {'flat': True}, 'shape'),
        ('query-named-block-nodes', None, 'shape'),
        ('block_resize', {'node-name': 'q1', 'size': 2 * MiB}, 'exact'),
        ('block_resize', {'node-name': 'q1', 'size': 1000}, 'exact'),
        ('block_resize', {'node-name': 'q1', 'size': -5}, 'exact'),
        ('block_resize', {'node-name': 'nope', 'size': MiB}, 'exact'),
        ('block_resize', {'device': 'r0', 'size': MiB}, 'exact'),
        ('block_resize', {'node-name': 'r0', 'size': 4 * MiB}, 'exact'),
        ('block_resize', {'node-name': 'n0', 'size': 4 * MiB}, 'exact'),
        ('block_resize', {'node-name': 'q1'}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'w0', 'offset': 512,
                          'file': {'driver': 'file', 'filename': b}}, 'exact'),
        ('block_resize', {'node-name': 'w0', 'size': MiB}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'w1', 'offset': 512, 'size': 512,
                          'file': {'driver': 'file', 'filename': b}}, 'exact'),
        # w0's window shares no resize of b.raw with w1's file node
        ('block_resize', {'node-name': 'w1', 'size': MiB}, 'prefix:Failed to get "resize" lock'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'offset': 8 * MiB,
                          'file': 'f0'}, 'exact'),
        ('blockdev-add', {'driver': 'raw', 'node-name': 'x', 'offset': 512, 'size': 4 * MiB,
                          'file': 'f0'}, 'exact'),
        ('query-blockstats', None, 'exact'),
        ('query-blockstats', {'query-nodes': True}, 'shape'),
    ]


def sizes(c):
    return {n['node-name']: n['image']['virtual-size']
            for n in c.cmd('query-named-block-nodes')['return']
            if not n['node-name'].startswith('#')}


def options(c):
    """What each named node says of the options it was given (or inherited)."""
    return {n['node-name']: (n['ro'], n['detect_zeroes'], n['cache'], n['drv'])
            for n in c.cmd('query-named-block-nodes')['return']
            if not n['node-name'].startswith('#')}


def run(kind, top):
    tmp = os.path.join(top, kind)
    os.mkdir(tmp)
    for n in ('a.raw', 'b.raw', 'd.raw'):
        with open(os.path.join(tmp, n), 'wb') as f:
            f.truncate(MiB)
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', os.path.join(tmp, 'c.qcow2'),
                    '1M'], check=True)
    d = _qmp.Daemon(kind, tmp)
    ok = False
    try:
        c = d.client().negotiate()
        replies, seen = [], []
        for cmd, args, how in script(tmp):
            before = names(c)
            r = c.cmd(cmd, args)
            replies.append(json.loads(json.dumps(r).replace(tmp, 'TMP')))
            if 'error' in r and names(c) != before:
                _qmp.fail('%s: %s %r failed but changed the nodes: %r -> %r'
                          % (kind, cmd, args, before, names(c)))
            seen.append(names(c))
        effect = {'sizes': sizes(c), 'names': names(c), 'options': options(c),
                  'a.raw': os.stat(os.path.join(tmp, 'a.raw')).st_size,
                  'b.raw': os.stat(os.path.join(tmp, 'b.raw')).st_size}
        for n in ('r0', 'f0', 'r1', 'q1', 'n0', 'dz', 'w0', 'w1'):
            r = c.cmd('blockdev-del', {'node-name': n})
            if r != {'return': {}}:
                _qmp.fail('%s: blockdev-del %s: %r' % (kind, n, r))
        effect['after-del'] = names(c)
        info = subprocess.run(['qemu-img', 'info', '--output=json', os.path.join(
            tmp, 'c.qcow2')], check=True, capture_output=True, text=True).stdout
        effect['c.qcow2'] = json.loads(info)['virtual-size']
        c.cmd('quit')
        d.wait()
        ok = True
        return replies, effect
    finally:
        d.cleanup(ok)


def compare(steps, rq, ri):
    for (cmd, args, how), q, i in zip(steps, rq, ri):
        what = '%s %s' % (cmd, json.dumps(args))
        if how == 'exact' and q != i:
            _qmp.fail('%s:\n  qsd:     %r\n  ioplane: %r' % (what, q, i))
        elif how.startswith('prefix:'):
            p = how[len('prefix:'):]
            for k, r in (('qsd', q), ('ioplane', i)):
                if not r.get('error', {}).get('desc', '').startswith(p):
                    _qmp.fail('%s: %s: expected an error starting %r: %r' % (what, k, p, r))
        elif how == 'shape' and shape(q) != shape(i):
            _qmp.fail('%s: keys/types differ\n  only qsd:     %s\n  only ioplane: %s'
                      % (what, sorted(shape(q) - shape(i)), sorted(shape(i) - shape(q))))


def check_stats(ri):
    """ioplane's extras: in flight and histograms, which count the metadata I/O."""
    stats = ri[-1]['return']
    q1 = [s for s in stats if s['node-name'] == 'q1'][0]
    x = q1['parent']['stats']['x-ioplane']
    if x['in-flight'] != 0 or len(x['latency-histograms']['read']) != 40:
        _qmp.fail('x-ioplane: %r' % x)
    if q1['parent']['stats']['rd_operations'] != sum(x['latency-histograms']['read']):
        _qmp.fail('read histogram does not sum to rd_operations: %r' % q1['parent'])


def main():
    if not _qmp.QSD:
        _qmp.skip('qemu-storage-daemon is not installed')
    with tempfile.TemporaryDirectory() as top:
        steps = script(top)
        rq, eq = run('qsd', top)
        ri, ei = run('ioplane', top)
        compare(steps, rq, ri)
        if eq != ei:
            _qmp.fail('effects differ:\n  qsd:     %r\n  ioplane: %r' % (eq, ei))
        if ei['a.raw'] != 4 * MiB or ei['c.qcow2'] != 2 * MiB or ei['after-del']:
            _qmp.fail('unexpected effects: %r' % ei)
        check_stats(ri)
    print('ok: %d commands, replies and effects as qemu-storage-daemon\'s' % len(rq))


main()
