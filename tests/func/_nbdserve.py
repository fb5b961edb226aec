"""Start and stop `ioplane serve` from Python functional tests (stdlib only).

Serve(args) starts $IOPLANE serve with its log in a file, waits (bounded) until every unix
socket it was given listens, and stop() sends a signal and waits (bounded) for the exit
status. The leading underscore keeps the test runner from running this file as a test.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ioplane():
    """The binary under test, or exit 77 saying why there is none."""
    path = os.environ.get("IOPLANE") or os.path.join(
        os.environ.get("IOPLANE_BUILD") or os.path.join(SRC, "build"), "ioplane")
    if not os.access(path, os.X_OK):
        print("SKIP: no ioplane binary at %s (set IOPLANE)" % path)
        sys.exit(77)
    return path


def scratch_dir():
    """A temporary directory on a real file system where there is one (O_DIRECT)."""
    for d in ("/var/tmp", "/tmp"):
        if os.path.isdir(d) and os.access(d, os.W_OK):
            return tempfile.TemporaryDirectory(prefix="ioplane-func.", dir=d)
    return tempfile.TemporaryDirectory(prefix="ioplane-func.")


def listening(path):
    """True once a unix socket listens at path (no probe connection is made)."""
    with open("/proc/net/unix") as f:
        for ln in f.readlines()[1:]:
            w = ln.split()
            if len(w) >= 8 and w[-1] == path and w[3] == "00010000":
                return True
    return False


def sanitized(path):
    """True when the binary is built with AddressSanitizer."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return "libasan" in out


class Serve:
    """One daemon: Serve(["--image", ..., "--nbd", "unix=PATH,..."], log=PATH)."""

    def __init__(self, args, log, env=None, wait=True):
        self.args = list(args)
        self.log_path = log
        self.log = open(log, "w+")
        self.p = subprocess.Popen([ioplane(), "serve"] + self.args, stdin=subprocess.DEVNULL,
                                  stdout=self.log, stderr=self.log,
                                  env=dict(os.environ, **(env or {})))
        self.pid = self.p.pid
        if wait:
            self.wait_listening()

    def sockets(self):
        socks = []
        for i, a in enumerate(self.args[:-1]):
            if a in ("--nbd", "--vhost-user-blk"):
                for kv in self.args[i + 1].split(","):
                    if kv.startswith("unix="):
                        socks.append(kv[5:])
        return socks

    def wait_listening(self, secs=60):
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError("the daemon exited (%d) during start-up:\n%s"
                                   % (self.p.returncode, self.text()))
            if all(listening(s) for s in self.sockets()):
                return
            time.sleep(0.05)
        raise RuntimeError("the daemon is not listening after %ds" % secs)

    def send_signal(self, sig=signal.SIGTERM):
        os.kill(self.pid, sig)

    def wait(self, secs=60):
        """Exit status, or None if still running after secs."""
        try:
            return self.p.wait(secs)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, secs=60):
        """Send sig, wait for the exit; the status (a hang is killed and reported as -9)."""
        if self.p.poll() is None:
            self.send_signal(sig)
        rc = self.wait(secs)
        if rc is None:
            self.kill()
            return -9
        return rc

    def alive(self):
        return self.p.poll() is None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def close(self):
        self.kill()
        self.log.close()


def run_cases(cases, errors):
    """Run [(name, fn(tmpdir))], each in a fresh scratch directory (argv[1]: only the
    names containing it); an exception of a type in `errors` fails the case. Prints one
    line per case and a summary; returns the exit status."""
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    failed = []
    for name, fn in cases:
        if only not in name:
            continue
        with scratch_dir() as tmp:
            t0 = time.monotonic()
            try:
                fn(tmp)
                print("ok   %s (%.1fs)" % (name, time.monotonic() - t0), flush=True)
            except errors as e:
                print("FAIL %s: %s: %s" % (name, type(e).__name__, e), flush=True)
                if os.environ.get("FUNC_TRACEBACK"):
                    traceback.print_exc()
                failed.append(name)
    print("%s: %d failed" % ("FAIL" if failed else "PASS", len(failed)))
    return 1 if failed else 0
