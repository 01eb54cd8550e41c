"""Real processes for the kvgate tests and benchmark: a kvstored on a temporary shm name, ipc
endpoint and NVMe file, `kvworker serve` processes on stories260K, kvgate on a free loopback
port. Every child gets PR_SET_PDEATHSIG so that a failed test leaves nothing behind; stop()
ends them in reverse order. Used by tests/gate/test_gate.py and bench/bench_gate.py."""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    """(status, body bytes) of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Cluster:
    def __init__(self, build, model, workers=2, gate_args=(), worker_args=(), metrics=False,
                 wrap=None):
        self.build, self.model = build, model
        self.wrap = wrap  # name -> argv prefix each child runs under (e.g. strace), or None
        self.dir = tempfile.mkdtemp(prefix="fkv-gate-")
        self.procs = {}
        self.store = f"ipc://{self.dir}/kvstored.sock"
        self.shm = f"/fkv-gate-{os.getpid()}"
        self.metrics = metrics
        self.ports = {}
        self.worker_args = list(worker_args)
        self.n_workers = workers
        self.gate_args = list(gate_args)

    def log(self, name):
        return open(os.path.join(self.dir, name + ".log"), "ab")

    def spawn(self, name, argv):
        if self.wrap:
            argv = self.wrap(name) + argv
        p = subprocess.Popen(argv, stdout=self.log(name), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.procs[name] = p
        return p

    def start(self):
        sets = [f"endpoint={self.store}", f"shm_name={self.shm}",
                f"nvme_path={self.dir}/tier.bin", "lock_memory=false", "dram_bytes=64M",
                "nvme_bytes=32M", "log_level=warn"]
        if self.metrics:
            self.ports["kvstored"] = free_port()
            sets.append(f"metrics_listen=127.0.0.1:{self.ports['kvstored']}")
        argv = [f"{self.build}/kvstore/kvstored"]
        for s in sets:
            argv += ["--set", s]
        self.spawn("kvstored", argv)
        self.wait_file(f"{self.dir}/kvstored.sock")
        for i in range(self.n_workers):
            self.start_worker(i)
        for i in range(self.n_workers):
            self.wait_file(self.worker_path(i))
        self.ports["gate"] = free_port()

        self.start_gate()
        self.wait_health(self.n_workers)
        return self

    def worker_path(self, i):
        return f"{self.dir}/w{i}.sock"

    def worker_endpoint(self, i):
        return "ipc://" + self.worker_path(i)

    def start_worker(self, i):
        argv = [f"{self.build}/worker/kvworker", "serve", "-m", self.model, "--store", self.store,
                "--listen", self.worker_endpoint(i), "-t", "1", "--backend", "cpu",
                "--name", f"w{i}"] + self.worker_args
        if self.metrics:
            self.ports.setdefault(f"w{i}", free_port())
            argv += ["--metrics", f"127.0.0.1:{self.ports[f'w{i}']}"]
        return self.spawn(f"w{i}", argv)

    def start_gate(self, name="kvgate", port=None, extra=(), own_args=True):
        port = port or self.ports["gate"]
        argv = [f"{self.build}/gate/kvgate", "--listen", f"127.0.0.1:{port}", "--probe-ms", "100",
                "--worker-timeout-ms", "2000"]
        for i in range(self.n_workers):
            argv += ["--worker", self.worker_endpoint(i)]
        return self.spawn(name, argv + (self.gate_args if own_args else []) + list(extra))

    def wait_file(self, path, timeout=30):
        t0 = time.time()
        while not os.path.exists(path):
            self.check_alive()
            if time.time() - t0 > timeout:
                raise RuntimeError(f"{path} did not appear in {timeout} s (logs in {self.dir})")
            time.sleep(0.02)

    def url(self, path="", port=None):
        return f"http://127.0.0.1:{port or self.ports['gate']}{path}"

    def health(self, port=None):
        st, body = http_get(self.url("/health", port))
        return st, json.loads(body)

    def wait_health(self, alive, timeout=30, port=None):
        t0 = time.time()
        while True:
            try:
                st, h = self.health(port)
                if h.get("workers_alive") == alive:
                    return h
            except (OSError, ValueError):
                pass
            self.check_alive()
            if time.time() - t0 > timeout:
                raise RuntimeError(f"kvgate did not see {alive} workers in {timeout} s")
            time.sleep(0.05)

    def check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None and not getattr(p, "expected_exit", False):
                raise RuntimeError(f"{name} exited with {p.returncode} (logs in {self.dir})")

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs[name]
        p.expected_exit = True
        p.send_signal(sig)
        p.wait(10)

    def stop(self):
        """SIGTERM in reverse order of start; returns {name: exit code}."""
        codes = {}
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            codes[name] = p.returncode
        return codes

    def cleanup(self, keep=False):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in os.listdir("/dev/shm"):
            if f.startswith(self.shm.lstrip("/")):
                try:
                    os.unlink("/dev/shm/" + f)
                except OSError:
                    pass
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)
