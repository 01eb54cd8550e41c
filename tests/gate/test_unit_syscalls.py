"""The installed units' system-call filters allow what the daemons really call (issue #22).

kvstored.service, kvworker@.service and kvgate.service confine their process with
SystemCallFilter=; a call outside the filter kills the process with SIGSYS, which no test
without a running systemd would see (libzmq's sched_setscheduler once killed kvgate at its
first request). This runs kvstored, one `kvworker serve` (stories260K, CPU) and kvgate under
strace, sends completions (plain and streamed) and a chat through kvgate, reads /health and
/metrics, stops everything with SIGTERM, and checks every system call each process made against
its unit's filter as systemd evaluates it (the first SystemCallFilter= line sets allow- or
deny-list mode, later lines add or take away; groups expanded by `systemd-analyze
syscall-filter`; the calls systemd always allows included). Exit 77 without strace or
systemd-analyze."""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, http_get  # noqa: E402

UNITS = {"kvstored": "kvstored.service", "w0": "kvworker@.service", "kvgate": "kvgate.service"}
# Allowed whatever the filter says (systemd.exec(5), SystemCallFilter=).
IMPLICIT = {"execve", "exit", "exit_group", "getrlimit", "rt_sigreturn", "sigreturn"}
_groups = {}


def expand(token):
    """The system calls a filter token names (a group, recursively, or one call)."""
    if not token.startswith("@"):
        return {token}
    if token not in _groups:
        out = subprocess.run(["systemd-analyze", "syscall-filter", token], capture_output=True,
                             text=True, check=True).stdout
        names = set()
        for line in out.splitlines()[1:]:
            t = line.strip()
            if t and not t.startswith("#"):
                names |= expand(t)
        _groups[token] = names
    return _groups[token]


def allowed_by(unit_path):
    """(allowed set or None, denied set or None) of a unit's SystemCallFilter= lines."""
    allow = deny = None
    with open(unit_path) as f:
        for line in f:
            m = re.match(r"\s*SystemCallFilter=(.*)", line)
            if not m:
                continue
            v = m.group(1).strip()
            neg = v.startswith("~")
            names = set()
            for tok in v.lstrip("~").split():
                names |= expand(tok)
            if allow is None and deny is None:
                if neg:
                    deny = names
                else:
                    allow = names | expand("@default") | IMPLICIT
            elif allow is not None:
                allow = allow - names if neg else allow | names
            else:
                deny = deny | names if neg else deny - names
    return allow, deny


def calls_in(trace_path):
    names = set()
    with open(trace_path, errors="replace") as f:
        for line in f:
            m = re.match(r"(?:\d+\s+)?(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed>)", line)
            if m:
                names.add(m.group(1))
    return names


def tracee_pid(strace_pid):
    """The traced command's pid: the strace process's child."""
    for _ in range(200):
        try:
            with open(f"/proc/{strace_pid}/task/{strace_pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.01)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    for tool in ("strace", "systemd-analyze"):
        if not shutil.which(tool):
            print(f"skip: {tool} not found (Debian: strace, systemd)")
            return 77
    probe = subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True)
    if probe.returncode != 0:
        print(f"skip: strace cannot trace here: {probe.stderr.decode().strip()}")
        return 77
    # LeakSanitizer cannot run under ptrace (an ASan build's daemons would abort at exit).
    asan = os.environ.get("ASAN_OPTIONS", "")
    os.environ["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0"
    known = expand("@known")
    c = Cluster(args.build, args.model, workers=1,
                wrap=lambda name: ["strace", "-f", "-qq", "-o", f"{c.dir}/{name}.strace"])
    fail = 0
    try:
        c.start()
        body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 16}
        for stream in (False, True):
            req = dict(body, stream=stream)
            out = subprocess.run(["curl", "-sf", c.url("/v1/completions"), "-H",
                                  "Content-Type: application/json", "-d", json.dumps(req)],
                                 capture_output=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"completion (stream={stream}) failed: {out.stderr}")
        http_get(c.url("/health"))
        http_get(c.url("/metrics"))
        # SIGTERM to each daemon itself (strace, signalled, would kill it instead).
        for name in reversed(list(c.procs)):
            p = c.procs[name]
            pid = tracee_pid(p.pid)
            # Without /proc/PID/task/*/children: strace, signalled, ends the daemon itself
            # (its shutdown path is then not traced).
            os.kill(pid or p.pid, signal.SIGTERM)
            p.wait(30)
            if p.returncode != 0:
                print(f"FAIL: {name} exited {p.returncode} under strace (logs in {c.dir})")
                fail = 1
        for name, unit in UNITS.items():
            allow, deny = allowed_by(f"{args.build}/systemd/{unit}")
            made = calls_in(f"{c.dir}/{name}.strace") & known
            if allow is None and deny is None:
                print(f"ok: {unit}: no SystemCallFilter")
                continue
            bad = sorted(made - allow) if allow is not None else sorted(made & deny)
            if bad:
                print(f"FAIL: {unit} forbids what {name} calls: {' '.join(bad)}")
                fail = 1
            else:
                print(f"ok: {unit} allows all {len(made)} system calls {name} made")
    finally:
        c.cleanup(keep=bool(fail))
    return fail


if __name__ == "__main__":
    sys.exit(main())
