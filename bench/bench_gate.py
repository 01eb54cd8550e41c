"""Load test: kvgate in front of one `kvworker serve` versus talking to that worker directly
(issue #17). Same process tree for both (one kvstored, one worker on stories260K, one kvgate),
same prompt, greedy, streamed; C client threads each send R requests back to back. Direct: a
ZeroMQ DEALER per thread speaking proto/worker.proto (hand-encoded: the messages are small).
Through kvgate: http.client per thread on a kept-alive connection, POST /v1/completions with
stream: true, reading the SSE lines. Per request: TTFT (send to first token), time per output
token after the first, total; per run: requests/s. Runs alternate direct/gate so drift hits
both; the ratios at the end are gate over direct of the same round.

Each row also gives the CPU time each process spent per request during the run (from
/proc/PID/stat: kvgate, the worker, and this client process), which says what the gateway costs
whatever the scheduler does. --pin puts the worker on the last CPU and everything else (kvstored,
kvgate, the client threads) on the others, so that on a small machine the worker has a core of
its own on both paths and the gateway's CPU is not taken from it; --store-with-worker puts
kvstored on the worker's CPU too (the store side on one core, kvgate and the clients on the
other), so that kvgate's CPU is not taken from kvstored's per-token commits either. The TTFT means say where a
first token's time goes: the client's, kvgate's (a request received to its first piece) and the
worker's (admitted to sampled), from the two processes' Prometheus histograms over the run.

  .venv/bin/python bench/bench_gate.py --build build [--concurrency 1,4] [--requests 100] [--pin]
      [--store-with-worker]
"""
import argparse
import http.client
import json
import os
import platform
import statistics
import struct
import sys
import threading
import time

import re
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gate"))
from harness import Cluster, http_get  # noqa: E402

PROMPT = "Once upon a time"


# ---------------------------------------------------------------- protobuf by hand

def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    return varint(num << 3 | wire) + payload


def ld(num, data):
    return field(num, 2, varint(len(data)) + data)


def generate_request(rid, n):
    sampling = field(1, 5, struct.pack("<f", 0.0)) + field(2, 0, varint(0)) + \
        field(3, 5, struct.pack("<f", 1.0))
    gen = ld(1, PROMPT.encode()) + field(3, 0, varint(n)) + ld(4, sampling)
    return field(1, 0, varint(1)) + field(2, 0, varint(rid)) + ld(10, gen)


def parse(buf):
    """{field number: value}; nested messages stay bytes."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"wire type {wire}")
        out[num] = v
    return out


def read_varint(buf, i):
    v = s = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return v, i


# ---------------------------------------------------------------- the two clients

def direct_client(endpoint, n_req, n_tok, out, rid_base):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    for k in range(n_req):
        t0 = time.perf_counter()
        s.send(generate_request(rid_base + k + 1, n_tok))
        first = last = None
        pieces = 0
        while True:
            r = parse(s.recv())
            status = r.get(2, 0)
            if status >= 1 << 63 or status >= 1 << 31:
                raise RuntimeError(f"worker refused: {r.get(3)}")
            if 10 in r:
                now = time.perf_counter()
                first = first or now
                last = now
                pieces += 1
            elif 11 in r:
                break
        out.append((first - t0, (last - first) / max(pieces - 1, 1), time.perf_counter() - t0,
                    pieces))
    s.close()


def gate_client(port, n_req, n_tok, out):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": "stories260K", "prompt": PROMPT, "max_tokens": n_tok,
                       "temperature": 0, "stream": True}).encode()
    for _ in range(n_req):
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"kvgate: {r.status} {r.read()[:200]!r}")
        first = last = None
        chunks = 0
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                r.read()
                break
            if b'"text":""' in line:
                continue  # the final chunk carries only finish_reason
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
        # Chunks may hold several tokens under load: per-token time from the worker's count.
        out.append((first - t0, (last - first) / max(n_tok - 1, 1), time.perf_counter() - t0,
                    chunks))
    conn.close()


def run(kind, target, conc, n_req, n_tok):
    out, threads = [], []
    for i in range(conc):
        if kind == "direct":
            t = threading.Thread(target=direct_client, args=(target, n_req, n_tok, out, i << 32))
        else:
            t = threading.Thread(target=gate_client, args=(target, n_req, n_tok, out))
        threads.append(t)
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return wall, out


def cpu_s(pid):
    """utime + stime of every thread of pid, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hist_sum_count(url, name):
    """(sum, count) of a Prometheus histogram at url."""
    txt = http_get(url)[1].decode()
    return tuple(float(re.search(rf"^{name}_{k} (\S+)", txt, re.M).group(1))
                 for k in ("sum", "count"))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(wall, out):
    ttft = [o[0] * 1e3 for o in out]
    tpot = [o[1] * 1e3 for o in out]
    tot = [o[2] * 1e3 for o in out]
    return {"req_s": len(out) / wall, "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90),
            "ttft_p99": pct(ttft, 99), "tpot_p50": pct(tpot, 50), "tpot_p90": pct(tpot, 90),
            "total_p50": pct(tot, 50), "total_p99": pct(tot, 99), "n": len(out)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="tests/data/models/stories260K/stories260K.gguf")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=100, help="per run, over all threads")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="1", help="kvworker serve -t")
    ap.add_argument("--pin", action="store_true",
                    help="worker on the last CPU, kvstored, kvgate and the clients on the others")
    ap.add_argument("--store-with-worker", action="store_true",
                    help="with --pin: kvstored on the worker's CPU (the store side on one core, "
                         "kvgate and the clients on the others)")
    args = ap.parse_args()
    wrap = None
    if args.pin:
        n = os.cpu_count()
        if n < 2:
            sys.exit("bench_gate: --pin needs 2 CPUs")
        rest = f"0-{n - 2}" if n > 2 else "0"
        back = ("w", "kvstored") if args.store_with_worker else ("w",)
        wrap = lambda name: ["taskset", "-c", str(n - 1) if name.startswith(back) else rest]  # noqa: E731
        os.sched_setaffinity(0, set(range(n - 1)))  # before any client thread starts
    c = Cluster(os.path.abspath(args.build), os.path.abspath(args.model), workers=1,
                worker_args=["-t", args.threads, "--max-seqs", "16"], wrap=wrap, metrics=True)
    try:
        c.start()
        ep, port = c.worker_endpoint(0), c.ports["gate"]
        run("direct", ep, 2, 5, args.tokens)  # warm-up both paths
        run("gate", port, 2, 5, args.tokens)
        print(f"# {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
              f"{time.strftime('%Y-%m-%d %H:%M')}, {args.tokens} tokens/request, "
              f"worker -t {args.threads}{', pinned' if args.pin else ''}"
              f"{', kvstored with the worker' if args.pin and args.store_with_worker else ''}")
        pids = {"gate": c.procs["kvgate"].pid, "worker": c.procs["w0"].pid}
        hists = {"gate": (c.url("/metrics"), "freekv_gate_time_to_first_token_seconds"),
                 "worker": (f"http://127.0.0.1:{c.ports['w0']}/metrics",
                            "freekv_worker_time_to_first_token_seconds")}
        hdr = ("conc", "path", "req/s", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "total p50",
               "p99", "CPU ms/req: gate", "worker", "client", "TTFT mean: client", "gate",
               "worker")
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        ratios = []
        for conc in [int(x) for x in args.concurrency.split(",")]:
            per = max(1, args.requests // conc)
            for rnd in range(args.rounds):
                res = {}
                for kind, tgt in (("direct", ep), ("gate", port)):
                    c0 = {k: cpu_s(v) for k, v in pids.items()}
                    h0 = {k: hist_sum_count(*v) for k, v in hists.items()}
                    p0 = time.process_time()
                    wall, out = run(kind, tgt, conc, per, args.tokens)
                    s = summary(wall, out)
                    h1 = {k: hist_sum_count(*v) for k, v in hists.items()}
                    tm = {k: ((h1[k][0] - h0[k][0]) / (h1[k][1] - h0[k][1]) * 1e3
                              if h1[k][1] > h0[k][1] and (k != "gate" or kind == "gate")
                              else float("nan")) for k in hists}
                    tm["client"] = statistics.mean(o[0] for o in out) * 1e3
                    cpu = {k: (cpu_s(v) - c0[k]) * 1e3 / s["n"] for k, v in pids.items()}
                    cpu["client"] = (time.process_time() - p0) * 1e3 / s["n"]
                    s["cpu"] = cpu
                    res[kind] = s
                    print(f"| {conc} | {kind} | {s['req_s']:.1f} | {s['ttft_p50']:.2f} | "
                          f"{s['ttft_p90']:.2f} | {s['ttft_p99']:.2f} | {s['tpot_p50']:.3f} | "
                          f"{s['tpot_p90']:.3f} | {s['total_p50']:.1f} | {s['total_p99']:.1f} | "
                          f"{cpu['gate']:.2f} | {cpu['worker']:.2f} | {cpu['client']:.2f} | "
                          f"{tm['client']:.2f} | {tm['gate']:.2f} | {tm['worker']:.2f} |",
                          flush=True)
                d, g = res["direct"], res["gate"]
                ratios.append((conc, rnd, g["req_s"] / d["req_s"], g["ttft_p50"] - d["ttft_p50"],
                               g["total_p50"] - d["total_p50"]))
        print("\n| conc | round | throughput gate/direct | TTFT p50 gate − direct (ms) | "
              "total p50 gate − direct (ms) |\n|---|---|---|---|---|")
        for conc, rnd, r, dt, dtot in ratios:
            print(f"| {conc} | {rnd} | {r:.3f} | {dt:+.2f} | {dtot:+.2f} |")
    finally:
        c.stop()
        c.cleanup()


if __name__ == "__main__":
    sys.exit(main())
