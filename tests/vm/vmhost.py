"""What the host-side helpers of run-vm-test.sh share (vm-hotplug.py, vm-migrate.py):
the QMP client of the functional tests, a bounded wait for a line on the guest's console
($VMTEST_CONSOLE), and a QMP command that must succeed."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'func'))
from _qmp import Client, fail  # noqa: E402,F401


def wait_console(text, secs):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        try:
            with open(os.environ['VMTEST_CONSOLE'], errors='replace') as f:
                if text in f.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    fail('the guest did not print %r within %d s' % (text, secs))


def ok(c, name, args=None):
    """Run a command that must succeed; its return value."""
    r = c.cmd(name, args)
    if 'return' not in r:
        fail('%s %r: %r' % (name, args, r))
    return r['return']
