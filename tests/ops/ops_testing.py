"""What the operations tests share: named checks, polling, and a `loom up`
run as a subprocess that is always stopped."""
import os
import subprocess
import time

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def listening_ports(pid):
    """TCP ports process `pid` listens on (from /proc: its socket inodes in LISTEN state).

    Lets a test start a server on port 0 and learn the port the kernel chose,
    instead of picking a free port and hoping it stays free.
    """
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/%d/net/tcp" % pid, "/proc/%d/net/tcp6" % pid):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # state LISTEN, inode ours
                ports.append(int(f[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


def wait_for(pred, seconds, interval=0.2):
    """pred()'s first truthy value within `seconds` (OSError counts as not yet), else None."""
    until = time.time() + seconds
    while time.time() < until:
        try:
            v = pred()
            if v:
                return v
        except OSError:
            pass
        time.sleep(interval)
    return None


class LoomUp:
    """`loom up` with its output in TMP/loom_up.log; terminated on exit if still running."""

    def __init__(self, loom_up, bin_dir, tmp, args):
        self.tmp = tmp
        self.run_dir = os.path.join(tmp, "run")
        self.log_path = os.path.join(tmp, "loom_up.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([loom_up, "--bin_dir=" + bin_dir, "--run_dir=" + self.run_dir, *args],
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, seconds):
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.log.close()
        if failures:
            print(open(self.log_path).read()[-4000:])
        return False


def finish():
    print("%d failed" % len(failures))
    raise SystemExit(1 if failures else 0)
