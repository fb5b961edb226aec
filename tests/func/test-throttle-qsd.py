#!/usr/bin/env python3
"""Throttle groups and the throttle filter over QMP, side by side: one script -
object-add of throttle-group objects (limits.* and x-* properties, every validity
error), qom-get / qom-set of their limits, blockdev-add driver=throttle (a child by
node-name and inline, several nodes sharing one group, missing and unknown groups),
query-named-block-nodes on the filter node, object-del of a group in use and free -
runs against qemu-storage-daemon and `ioplane serve`; every reply must be the same
(errors: class and text). Both are started with the same --object throttle-group and
--blockdev driver=throttle options, whose groups qom-get must show alike."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _qmp import QSD, Daemon, fail, skip  # noqa: E402

TG = 'throttle-group'
CMDLINE = ['--object', TG + ',id=cl0,limits.iops-total=100,limits.iops-total-max=200,'
           'limits.iops-total-max-length=5,limits.bps-read=1048576',
           '--object', TG + ',id=cl1,x-bps-total=1000000,x-iops-size=8192,x-iops-write=7',
           '--blockdev', 'driver=null-co,node-name=cn0,size=1048576',
           '--blockdev', 'driver=throttle,node-name=ct0,throttle-group=cl0,file=cn0']


def lim(**kw):
    return {k.replace('_', '-'): v for k, v in kw.items()}


def obj(i, **kw):
    return dict({'qom-type': TG, 'id': i}, **kw)


SCRIPT = [
    ('qom-get', {'path': 'cl0', 'property': 'limits'}),
    ('qom-get', {'path': '/objects/cl1', 'property': 'limits'}),
    ('object-del', {'id': 'cl0'}),  # ct0 uses it
    ('object-add', obj('tg0', limits=lim(iops_total=1000))),
    ('object-add', obj('tg0')),  # duplicate
    ('object-add', obj('cn0')),  # a node's name is not an object's
    ('object-add', obj('0bad')),
    ('object-add', obj('tg1', **{'x-iops-total': 500, 'x-bps-read-max': 5})),
    ('object-add', obj('tg2', limits=lim(iops_total=1000, iops_read=5))),
    ('object-add', obj('tg3', limits=lim(bps_total=1000, bps_write=5))),
    ('object-add', obj('tg4', limits=lim(iops_total_max=1000))),
    ('object-add', obj('tg5', limits={'bogus': 1})),
    ('object-add', obj('tg6', limits=lim(iops_total=-1))),
    ('object-add', obj('tg7', limits=lim(iops_total='x'))),
    ('object-add', obj('tg8', limits=lim(iops_total=10, iops_total_max_length=3))),
    ('object-add', obj('tg9', limits=lim(iops_total=10, iops_total_max=5))),
    ('object-add', obj('tga', limits=lim(bps_read=10, bps_read_max=20,
                                          bps_read_max_length=0))),
    ('object-add', obj('tgb', limits=lim(iops_write=10, iops_write_max=20,
                                          iops_write_max_length=1 << 33))),
    ('object-add', obj('tgc', **{'x-iops-read': -4})),
    ('object-add', obj('tgd', **{'x-iops-total': 10, 'x-iops-total-max': 20,
                                 'x-iops-total-max-length': 1 << 40})),
    ('object-add', obj('tge', limits=lim(iops_total=2 * 10**15))),
    ('object-add', obj('tgf', limits=lim(iops_total=10, iops_total_max=10**15,
                                          iops_total_max_length=2))),
    ('object-add', obj('tgg', **{'x-bogus': 1})),
    ('object-add', obj('tgh', **{'x-iops-total': 300, 'x-iops-total-max': 600,
                                 'x-iops-total-max-length': 4, 'x-iops-size': 4096})),
    ('qom-get', {'path': 'tgh', 'property': 'limits'}),
    ('qom-get', {'path': 'tg0', 'property': 'limits'}),
    ('qom-get', {'path': 'tg0', 'property': 'x-iops-total'}),
    ('qom-get', {'path': 'tg0', 'property': 'x-iops-size'}),
    ('qom-get', {'path': 'tg0', 'property': 'type'}),
    ('qom-get', {'path': 'tg0', 'property': 'nope'}),
    ('qom-get', {'path': 'nope', 'property': 'limits'}),
    ('qom-set', {'path': 'tg0', 'property': 'limits', 'value': lim(iops_total=2000)}),
    ('qom-get', {'path': 'tg0', 'property': 'limits'}),
    ('qom-set', {'path': 'tg0', 'property': 'limits', 'value': lim(iops_read=2000)}),
    ('qom-set', {'path': 'tg0', 'property': 'limits', 'value': lim(iops_total_max=5)}),
    ('qom-set', {'path': 'tg0', 'property': 'limits', 'value': lim(iops_total='5')}),
    ('qom-set', {'path': 'tg0', 'property': 'limits', 'value': 5}),
    ('qom-set', {'path': 'tg0', 'property': 'limits',
                 'value': lim(iops_total=0, bps_write=4096, bps_write_max=8192,
                              bps_write_max_length=2)}),
    ('qom-get', {'path': 'tg0', 'property': 'limits'}),
    ('qom-set', {'path': 'tg0', 'property': 'x-iops-total', 'value': 300}),
    ('qom-set', {'path': 'tg0', 'property': 'nope', 'value': 5}),
    ('qom-set', {'path': 'nope', 'property': 'limits', 'value': {}}),
    ('qom-get', {'path': 'tg0', 'property': 'limits'}),
    ('blockdev-add', {'driver': 'null-co', 'node-name': 'n0', 'size': 1 << 20}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't0', 'throttle-group': 'tg0',
                      'file': 'n0'}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't1', 'throttle-group': 'nope',
                      'file': 'n0'}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't1', 'file': 'n0'}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't1', 'throttle-group': 'tg0'}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't1', 'throttle-group': 'tg0',
                      'file': 'n0', 'limits': lim(iops_total=5)}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't2', 'throttle-group': 'tg0',
                      'file': {'driver': 'null-co', 'node-name': 'n2'}}),
    ('blockdev-add', {'driver': 'raw', 'node-name': 'r2', 'file': 't2'}),
    ('object-del', {'id': 'tg0'}),  # two nodes use it
    ('blockdev-del', {'node-name': 't0'}),
    ('object-del', {'id': 'tg0'}),  # t2 still does
    ('blockdev-del', {'node-name': 'r2'}),
    ('blockdev-del', {'node-name': 't2'}),
    ('object-del', {'id': 'tg0'}),
    ('object-del', {'id': 'tg0'}),
    ('qom-get', {'path': 'tg0', 'property': 'limits'}),
    ('blockdev-add', {'driver': 'throttle', 'node-name': 't0', 'throttle-group': 'tg0',
                      'file': 'n0'}),
]

NODE_KEYS = ('drv', 'backing_file_depth', 'file', 'ro')


def node_view(nodes, name):
    """The parts of a throttle node's BlockDeviceInfo that QEMU shows for filters."""
    n = [x for x in nodes if x['node-name'] == name]
    if len(n) != 1:
        return None
    n = n[0]
    img = n['image']
    return {'info': {k: n.get(k) for k in NODE_KEYS},
            'image': {k: img.get(k) for k in ('format', 'filename', 'virtual-size')},
            'child': {k: img.get('backing-image', {}).get(k) for k in ('format',
                                                                      'virtual-size')}}


def run(kind, tmp):
    d = Daemon(kind, tmp, CMDLINE)
    out, ok = [], False
    try:
        c = d.client().negotiate()
        for name, args in SCRIPT:
            out.append(c.cmd(name, args))
            if name == 'blockdev-add' and args.get('node-name') == 'r2':
                nodes = c.cmd('query-named-block-nodes')['return']
                out.append([node_view(nodes, x) for x in ('t2', 'ct0')])
        c.cmd('quit')
        d.wait()
        ok = True
    finally:
        d.cleanup(ok)
    return out


def main():
    if not QSD:
        skip('qemu-storage-daemon is not installed')
    with tempfile.TemporaryDirectory(prefix='ioplane-thr-qsd.') as tmp:
        q = run('qsd', tmp)
        i = run('ioplane', tmp)
    steps = []
    for name, args in SCRIPT:
        steps.append((name, args))
        if name == 'blockdev-add' and args.get('node-name') == 'r2':
            steps.append(('query-named-block-nodes', 't2, ct0'))
    bad = 0
    for (name, args), a, b in zip(steps, q, i):
        if a != b:
            bad += 1
            print('DIFF %s %s\n  qsd:     %s\n  ioplane: %s' % (
                name, json.dumps(args), json.dumps(a, sort_keys=True),
                json.dumps(b, sort_keys=True)))
    if len(q) != len(i):
        fail('%d replies from qsd, %d from ioplane' % (len(q), len(i)))
    errors = sum(1 for a in q if isinstance(a, dict) and 'error' in a)
    if bad:
        fail('%d of %d replies differ' % (bad, len(q)))
    print('ok: %d replies alike (%d errors)' % (len(q), errors))


main()
