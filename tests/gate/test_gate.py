"""kvgate with real processes and real clients (issue #17, docs/design.md §6): a real kvstored,
two `kvworker serve` on stories260K and one kvgate on a loopback port; the official `openai`
Python client, http.client and curl talk to it.

  - completions and chat completions through the openai client, streamed and not: greedy text
    equals `kvworker generate --temp 0` for the same prompt (for chat: the Llama 2 layout of the
    messages), usage counts match the worker's, stop strings cut the text, [DONE] ends streams;
  - 16 concurrent streamed requests all complete and both workers served some
    (freekv_gate_worker_requests_total);
  - bad input (malformed JSON, a 10 MB body, an unknown field, negative max_tokens, a prompt
    longer than the context, unknown model, wrong method, unknown path) gets the right 4xx and an
    OpenAI error object, and /health stays 200 after each;
  - chat on a model without a recognised template is refused naming --chat-template;
  - past --max-inflight a request gets 429; with no worker answering /health and requests get
    503 naming the worker; --listen on a non-loopback address is refused without --allow-remote;
  - `promtool check metrics` passes on the /metrics of kvgate, both workers and kvstored, and one
    completion moves the counters by exactly what it did;
  - SIGKILL of one worker mid-stream: that stream ends with an error the client raises, the
    others complete, /health stays 200, new requests are served, nothing hangs; the worker,
    restarted, is put back into service;
  - one event loop: 12 streams in flight leave kvgate's thread count where it was idle; a stream
    whose workers are stopped (SIGSTOP) gets `: keep-alive` comments every --keepalive-s and
    completes when they go on; SIGTERM with a stream in flight ends it with an error event and
    kvgate exits 0 at once.
Run by ctest through tests/gate/run.sh (exit 77 with the reason when the project virtualenv
with openai is missing)."""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, http_get  # noqa: E402

MODEL_ID = "stories260K"
RESULTS = []


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def generate(args, prompt, n):
    """What `kvworker generate --temp 0` prints for prompt (its text, without the prompt)."""
    out = subprocess.run([f"{args.build}/worker/kvworker", "generate", "-m", args.model, "-p",
                          prompt, "-n", str(n), "--temp", "0", "-t", "1", "--backend", "cpu"],
                         capture_output=True, check=True, timeout=120)
    text = out.stdout.decode("utf-8")
    return text[:-1] if text.endswith("\n") else text  # generate ends its output with one


def client(c):
    return openai.OpenAI(base_url=c.url("/v1"), api_key="unused", max_retries=0, timeout=60)


def metric(text, name, labels=None):
    """The value of one sample in Prometheus text (labels: a dict that must match)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if labels and any(got.get(k) != v for k, v in labels.items()):
            continue
        return float(m.group(3))
    return None


def raw(c, method, path, body=b"", headers=None, port=None):
    conn = http.client.HTTPConnection("127.0.0.1", port or c.ports["gate"], timeout=30)
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def expect_error(c, status, method, path, body, code=None, substr=None):
    st, data = raw(c, method, path, body)
    check(st == status, f"{method} {path}: status {st}, expected {status}: {data[:300]!r}")
    e = json.loads(data)["error"]
    for k in ("message", "type", "param", "code"):
        check(k in e, f"error object lacks {k}: {e}")
    if code:
        check(e["code"] == code, f"error code {e['code']}, expected {code}")
    if substr:
        check(substr in e["message"], f"'{substr}' not in '{e['message']}'")
    st, h = c.health()
    check(st == 200 and h["status"] == "ok", f"/health after a bad request: {st} {h}")
    return e


# ---------------------------------------------------------------- the cases

def t_models_health(args, c):
    st, body = http_get(c.url("/v1/models"))
    check(st == 200, f"/v1/models {st}")
    ids = [m.id for m in client(c).models.list().data]
    check(ids == [MODEL_ID], f"models {ids}")
    st, h = c.health()
    check(st == 200 and h["workers_alive"] == 2, f"health {st} {h}")


def t_completion_greedy(args, c):
    prompt, n = "Once upon a time", 40
    want = generate(args, prompt, n)
    r = client(c).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=n, temperature=0)
    check(r.object == "text_completion", r.object)
    check(r.choices[0].text == want, f"text {r.choices[0].text!r} != generate {want!r}")
    check(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
    check(r.usage.completion_tokens == n and r.usage.prompt_tokens > 0, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + n, f"usage {r.usage}")
    # Streamed: the same text, chunk by chunk, usage in the last chunk.
    chunks = list(client(c).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=n,
                                               temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(text == want, f"streamed {text!r} != {want!r}")
    check(len(chunks) > 3, f"only {len(chunks)} chunks")
    fin = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(fin == ["length"], f"finish reasons {fin}")
    check(chunks[-1].usage and chunks[-1].usage.completion_tokens == n, f"usage {chunks[-1]}")


def t_completion_stop_seed(args, c):
    prompt = "Once upon a time"
    want = generate(args, prompt, 40)
    stop = " She"
    check(stop in want, "the stop string must occur in the greedy text")
    r = client(c).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0,
                                     stop=[stop, "zzz"])
    check(r.choices[0].text == want[:want.index(stop)], f"stopped text {r.choices[0].text!r}")
    check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    s = "".join(ch.choices[0].text for ch in client(c).completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0, stop=stop, stream=True))
    check(s == want[:want.index(stop)], f"streamed stopped text {s!r}")
    # Sampling with a seed is reproducible, and differs from greedy.
    a = client(c).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=30,
                                     temperature=1.0, top_p=0.9, seed=7).choices[0].text
    b = client(c).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=30,
                                     temperature=1.0, top_p=0.9, seed=7).choices[0].text
    check(a == b, f"same seed, different text: {a!r} {b!r}")


def t_chat(args, c):
    msgs = [{"role": "system", "content": "Tell a story."},
            {"role": "user", "content": "Once upon a time"}]
    # Llama 2 layout (kvgate runs with --chat-template llama2); BOS is the worker's.
    rendered = "[INST] <<SYS>>\nTell a story.\n<</SYS>>\n\nOnce upon a time [/INST]"
    want = generate(args, rendered, 30)
    r = client(c).chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=30,
                                          temperature=0)
    check(r.object == "chat.completion", r.object)
    m = r.choices[0].message
    check(m.role == "assistant" and m.content == want, f"chat {m.content!r} != {want!r}")
    check(r.usage.completion_tokens == 30, f"usage {r.usage}")
    chunks = list(client(c).chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=30,
                                                    temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    check(text == want, f"streamed chat {text!r} != {want!r}")
    check(chunks[-1].choices[0].finish_reason == "length", f"last chunk {chunks[-1]}")
    # The raw stream: data: lines, [DONE] last.
    st, body = raw(c, "POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL_ID, "messages": msgs, "max_tokens": 5, "stream": True}).encode())
    events = [e for e in body.decode().split("\n\n") if e]
    check(st == 200 and all(e.startswith("data: ") for e in events), f"SSE {body[:200]!r}")
    check(events[-1] == "data: [DONE]", f"last event {events[-1]!r}")


def t_concurrent(args, c):
    st, m0 = http_get(c.url("/metrics"))
    before = [metric(m0.decode(), "freekv_gate_worker_requests_total",
                     {"worker": c.worker_endpoint(i)}) or 0 for i in range(2)]
    prompts = [f"Once upon a time there was a {w}" for w in
               ["dog", "cat", "bird", "girl", "boy", "king", "tree", "ball"]] * 2

    def one(p):
        text, fin = "", None
        for ch in client(c).completions.create(model=MODEL_ID, prompt=p, max_tokens=48,
                                               temperature=0, stream=True):
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
        return p, text, fin

    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(one, prompts, timeout=120))
    check(len(res) == 16 and all(f == "length" and t for _, t, f in res), f"results {res}")
    # The same prompt, greedy, gives the same text wherever it ran.
    by = {}
    for p, t, _ in res:
        by.setdefault(p, set()).add(t)
    check(all(len(v) == 1 for v in by.values()), "one prompt, two texts")
    st, m1 = http_get(c.url("/metrics"))
    after = [metric(m1.decode(), "freekv_gate_worker_requests_total",
                    {"worker": c.worker_endpoint(i)}) for i in range(2)]
    spread = [a - b for a, b in zip(after, before)]
    check(sum(spread) == 16 and min(spread) >= 4, f"requests per worker {spread}")


def t_bad_input(args, c):
    P = "/v1/completions"
    expect_error(c, 400, "POST", P, b'{"model": "stories260K", "prompt": "x"', None, "could not parse")
    expect_error(c, 400, "POST", P, b'{"model": "stories260K", "prompt": "x"} trailing')
    expect_error(c, 400, "POST", P, b'\xff\xfe{}')
    expect_error(c, 400, "POST", P, b'[1, 2]')
    expect_error(c, 413, "POST", P, b'{"prompt": "' + b"a" * (10 << 20) + b'"}',
                 "request_too_large")
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": "x",
                                                "frobnicate": 1}).encode(), None,
                 "Unrecognized request argument supplied: frobnicate")
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": "x",
                                                "max_tokens": -5}).encode())
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": "x",
                                                "temperature": "hot"}).encode())
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": "x", "n": 2}).encode())
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": "x",
                                                "logprobs": 5}).encode())
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID}).encode())
    long_prompt = "Once upon a time there was a little girl. " * 400
    expect_error(c, 400, "POST", P, json.dumps({"model": MODEL_ID, "prompt": long_prompt,
                                                "max_tokens": 4}).encode(),
                 "context_length_exceeded")
    expect_error(c, 400, "POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "x"}]}).encode())
    expect_error(c, 404, "POST", P, json.dumps({"model": "gpt-4", "prompt": "x"}).encode(),
                 "model_not_found")
    expect_error(c, 405, "GET", P, b"")
    expect_error(c, 404, "GET", "/v2/nothing", b"")
    # The openai client raises the matching exceptions.
    try:
        client(c).completions.create(model="nope", prompt="x")
        check(False, "unknown model accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, str(e))
    try:
        client(c).completions.create(model=MODEL_ID, prompt=long_prompt, max_tokens=4)
        check(False, "too long a prompt accepted")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", str(e))
    # curl, as the README shows it.
    out = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", c.url("/v1/completions"),
                          "-H", "Content-Type: application/json", "-d",
                          '{"model": "stories260K", "prompt": "Once upon a time", '
                          '"max_tokens": 8, "temperature": 0}'],
                         capture_output=True, check=True, timeout=30).stdout.decode()
    body, code = out.rsplit("\n", 1)
    check(code == "200" and json.loads(body)["choices"][0]["text"], f"curl: {out}")


def t_no_template(args, c):
    port = c.ports.setdefault("gate2", __import__("harness").free_port())
    c.start_gate("kvgate2", port, own_args=False)
    c.wait_health(2, port=port)
    st, data = raw(c, "POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}).encode(), port=port)
    e = json.loads(data)["error"]
    check(st == 400 and "--chat-template" in e["message"], f"{st} {e}")
    st, data = raw(c, "POST", "/v1/completions", json.dumps(
        {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2}).encode(), port=port)
    check(st == 200, f"completions without a template: {st}")
    c.kill("kvgate2", signal.SIGTERM)
    check(c.procs["kvgate2"].returncode == 0, "kvgate exit code after SIGTERM")


def t_limits(args, c):
    """429 past --max-inflight, 503 (and /health 503 with the reason) when no worker answers,
    and --listen on a non-loopback address refused without --allow-remote."""
    h = __import__("harness")
    port = c.ports.setdefault("gate3", h.free_port())
    c.start_gate("kvgate3", port, extra=["--max-inflight", "1"])
    c.wait_health(2, port=port)
    first = []

    def long_stream():
        cl = openai.OpenAI(base_url=c.url("/v1", port), api_key="unused", max_retries=0, timeout=60)
        for ch in cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=1800,
                                        temperature=0, stream=True):
            first.append(ch)
        return len(first)

    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(long_stream)
    t0 = time.time()
    while not first and time.time() - t0 < 30:
        time.sleep(0.005)
    check(first, "the long stream did not start")
    body = json.dumps({"model": MODEL_ID, "prompt": "hi", "max_tokens": 2}).encode()
    st, data = raw(c, "POST", "/v1/completions", body, port=port)
    check(st == 429, f"second request past --max-inflight 1: {st} {data[:200]!r}")
    e = json.loads(data)["error"]
    check(e["code"] == "rate_limit_exceeded" and "--max-inflight" in e["message"], f"429 body {e}")
    check(fut.result(timeout=120) > 0, "the stream in flight completes")
    pool.shutdown()
    st, data = raw(c, "POST", "/v1/completions", body, port=port)
    check(st == 200, f"after the stream ended: {st}")
    c.kill("kvgate3", signal.SIGTERM)
    check(c.procs["kvgate3"].returncode == 0, "kvgate3 exit code after SIGTERM")

    # No worker answers: /health and requests get 503, saying which worker and why.
    port = c.ports.setdefault("gate4", h.free_port())
    nobody = f"ipc://{c.dir}/nobody.sock"
    c.spawn("kvgate4", [f"{args.build}/gate/kvgate", "--listen", f"127.0.0.1:{port}",
                        "--probe-ms", "100", "--worker-timeout-ms", "500", "--worker", nobody])
    st, hb = None, None
    t0 = time.time()
    while time.time() - t0 < 30:
        try:
            st, hb = c.health(port)
            break
        except (OSError, ValueError):
            time.sleep(0.05)
    check(st == 503 and hb["workers_alive"] == 0, f"/health with no worker: {st} {hb}")
    check(nobody in json.dumps(hb), f"/health names the worker: {hb}")
    st, data = raw(c, "POST", "/v1/completions", body, port=port)
    e = json.loads(data)["error"]
    check(st == 503 and e["code"] == "service_unavailable", f"request with no worker: {st} {e}")
    c.kill("kvgate4", signal.SIGTERM)
    check(c.procs["kvgate4"].returncode == 0, "kvgate4 exit code after SIGTERM")

    # Not loopback: refused at start unless --allow-remote.
    r = subprocess.run([f"{args.build}/gate/kvgate", "--listen", f"0.0.0.0:{h.free_port()}",
                        "--worker", nobody], capture_output=True, timeout=30)
    err = r.stderr.decode()
    check(r.returncode != 0 and "not a loopback address" in err and "--allow-remote" in err,
          f"--listen 0.0.0.0 without --allow-remote: exit {r.returncode}: {err!r}")


def t_kill_worker(args, c):
    """Streams long enough (-c 2048 workers, 1,800 tokens) to be killed in the middle."""
    n_streams = 4
    started = concurrent.futures.ThreadPoolExecutor(n_streams)
    firsts = []

    def one(i):
        text, fin = "", None
        try:
            for ch in client(c).completions.create(model=MODEL_ID, prompt=f"Once upon a time {i}",
                                                   max_tokens=1800, temperature=0, stream=True):
                text += ch.choices[0].text
                fin = ch.choices[0].finish_reason or fin
                if len(text) > 20 and i not in firsts:
                    firsts.append(i)
            return ("ok", len(text), fin)
        except openai.APIError as e:
            return ("error", len(text), str(e))

    st, m = http_get(c.url("/metrics"))
    rec0 = metric(m.decode(), "freekv_gate_worker_recoveries_total", {"worker": c.worker_endpoint(0)})
    futs = [started.submit(one, i) for i in range(n_streams)]
    t0 = time.time()
    while len(firsts) < n_streams and time.time() - t0 < 30:
        time.sleep(0.005)
    check(len(firsts) == n_streams, "streams did not start")
    st, h = c.health()
    check(all(w["requests_in_flight"] >= 1 for w in h["workers"]), f"not spread: {h}")
    c.kill("w0")
    res = [f.result(timeout=60) for f in futs]
    started.shutdown()
    errs = [r for r in res if r[0] == "error"]
    oks = [r for r in res if r[0] == "ok"]
    check(errs and all(r[1] > 0 for r in errs), f"killed streams should fail mid-way: {res}")
    check(oks and all(r[2] == "length" for r in oks), f"the other worker's streams: {res}")
    check(any("went away" in r[2] for r in errs), f"error text: {errs}")
    st, h = c.health()
    check(st == 200 and h["workers_alive"] == 1, f"health after the kill: {st} {h}")
    for _ in range(4):
        r = client(c).completions.create(model=MODEL_ID, prompt="Once", max_tokens=8, temperature=0)
        check(r.choices[0].finish_reason == "length", "served after the kill")
    # Restarted on the same endpoint: taken back into service.
    os.unlink(c.worker_path(0)) if os.path.exists(c.worker_path(0)) else None
    c.start_worker(0)
    c.wait_health(2)
    st, m = http_get(c.url("/metrics"))
    rec = metric(m.decode(), "freekv_gate_worker_recoveries_total", {"worker": c.worker_endpoint(0)})
    check(rec == rec0 + 1, f"recoveries of w0: {rec0} before the kill, {rec} after")


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^Threads:\s+(\d+)", f.read(), re.M).group(1))


def sse_lines(conn_resp):
    """The lines of a streamed response as they come (http.client, no buffering of events)."""
    while True:
        line = conn_resp.fp.readline()
        if not line:
            return
        yield line.decode().rstrip("\n")


def t_event_loop(args, c):
    """No thread per connection; keep-alive comments from the loop's timer; SIGTERM mid-stream."""
    h = __import__("harness")
    pid = c.procs["kvgate"].pid
    idle = threads(pid)
    started, stop = [], []

    def one(i):
        n = 0
        for ch in client(c).completions.create(model=MODEL_ID, prompt=f"Once upon a time {i}",
                                               max_tokens=600, temperature=0, stream=True):
            n += 1
            if n == 2:
                started.append(i)
        return n

    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        futs = [ex.submit(one, i) for i in range(12)]
        t0 = time.time()
        while len(started) < 12 and time.time() - t0 < 60:
            time.sleep(0.005)
        busy = threads(pid)
        res = [f.result(timeout=120) for f in futs]
    check(len(started) == 12, f"only {len(started)} of 12 streams were in flight together")
    check(busy == idle, f"kvgate had {idle} threads idle and {busy} with 12 streams")
    check(all(n > 100 for n in res), f"chunks per stream {res}")

    # Keep-alive: a gate of its own that does not take stopped workers out for 20 s.
    port = c.ports.setdefault("gate5", h.free_port())
    c.start_gate("kvgate5", port, extra=["--keepalive-s", "1", "--worker-timeout-ms", "20000"])
    c.wait_health(2, port=port)
    body = json.dumps({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 64,
                       "temperature": 0, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    lines = sse_lines(r)
    first = next(l for l in lines if l.startswith("data: "))
    text = json.loads(first[6:])["choices"][0]["text"]
    workers = [c.procs[f"w{i}"] for i in range(2)]
    for w in workers:
        w.send_signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        comments = []
        for line in lines:
            if line.startswith(":"):
                comments.append(time.time() - t0)
            elif line.startswith("data: "):  # sent before the stop
                text += json.loads(line[6:])["choices"][0]["text"]
            if len(comments) == 2:
                break
    finally:
        for w in workers:
            w.send_signal(signal.SIGCONT)
    check(len(comments) == 2 and comments[0] < 2.5, f"keep-alive comments at {comments} s")
    done = False
    for line in lines:
        if line.startswith("data: [DONE]"):
            done = True
            break
        if line.startswith("data: "):
            text += json.loads(line[6:])["choices"][0]["text"]
    conn.close()
    check(done, "the stream did not end with [DONE] after the workers went on")
    want = generate(args, "Once upon a time", 64)
    check(text == want, f"text after the pause {text!r} != {want!r}")

    # SIGTERM with a stream in flight: the client is told, kvgate exits 0 promptly.
    got = []

    def long_stream():
        cl = openai.OpenAI(base_url=c.url("/v1", port), api_key="unused", max_retries=0, timeout=60)
        try:
            for ch in cl.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=1800,
                                            temperature=0, stream=True):
                got.append(ch)
            return "ended"
        except openai.APIError as e:
            return str(e)

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(long_stream)
        t0 = time.time()
        while not got and time.time() - t0 < 30:
            time.sleep(0.005)
        check(got, "the long stream did not start")
        t0 = time.time()
        c.kill("kvgate5", signal.SIGTERM)
        took = time.time() - t0
        out = fut.result(timeout=30)
    check(c.procs["kvgate5"].returncode == 0, "kvgate5 exit code after SIGTERM")
    check(took < 3, f"kvgate5 took {took:.1f} s to stop")
    check("stopping" in out, f"the stream in flight at SIGTERM: {out!r}")
    c.wait_health(2)  # the main gate took the stopped workers out for a while


def scrape(c, who):
    st, body = http_get(f"http://127.0.0.1:{c.ports[who]}/metrics")  # kvgate: its API port
    check(st == 200, f"{who} /metrics: {st}")
    return body.decode()


def promtool(text, who):
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True,
                       timeout=30)
    check(p.returncode == 0, f"promtool on {who}: {p.stdout.decode()} {p.stderr.decode()}")


def t_metrics(args, c):
    """promtool accepts all three pages, and one 8-token completion moves the counters by what
    it did: 8 tokens at the gate and over the workers, COMMITs at the store."""
    names = ["gate", "w0", "w1", "kvstored"]
    pages = {w: scrape(c, w) for w in names}
    for w in names:
        promtool(pages[w], w)
    g = pages["gate"]
    check(metric(g, "freekv_gate_http_requests_total",
                 {"path": "/v1/completions", "code": "200"}) > 0, "gate 200s")
    check(metric(g, "freekv_gate_http_requests_total",
                 {"path": "/v1/completions", "code": "400"}) > 0, "gate 400s")
    check(metric(g, "freekv_gate_time_to_first_token_seconds_count") > 0, "gate ttft")
    check("# TYPE freekv_gate_request_duration_seconds histogram" in g, "histogram type")
    w = pages["w1"]
    check(metric(w, "freekv_worker_requests_total", {"reason": "length"}) > 0, "worker ends")
    check(metric(w, "freekv_worker_time_to_first_token_seconds_count") > 0, "worker ttft")
    s = pages["kvstored"]
    check(metric(s, "freekv_store_rpc_requests_total", {"command": "Hello"}) >= 2, "store hellos")
    check(metric(s, "freekv_store_rpc_duration_seconds_count") > 0, "store rpc histogram")
    before = pages
    r = client(c).completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8,
                                     temperature=0)
    check(r.usage.completion_tokens == 8, f"usage {r.usage}")
    after = {w: scrape(c, w) for w in names}

    def delta(who, name, labels=None):
        return metric(after[who], name, labels) - metric(before[who], name, labels)

    check(delta("gate", "freekv_gate_completion_tokens_total") == 8, "gate tokens delta")
    check(delta("gate", "freekv_gate_prompt_tokens_total") == r.usage.prompt_tokens,
          "gate prompt tokens delta")
    check(delta("w0", "freekv_worker_generated_tokens_total") +
          delta("w1", "freekv_worker_generated_tokens_total") == 8, "worker tokens delta")
    check(delta("w0", "freekv_worker_requests_total", {"reason": "length"}) +
          delta("w1", "freekv_worker_requests_total", {"reason": "length"}) == 1, "worker ends")
    check(delta("kvstored", "freekv_store_ring_ops_total", {"op": "COMMIT"}) > 0, "commits")


def t_prefix(args, c):
    """Prefix sharing without flags (docs/design.md §4): a request whose prompt extends an
    earlier one's finds that prompt's pages in kvstored (usage.prompt_tokens_details.
    cached_tokens, whole ubatches of 256), with the greedy text of a cold run; another
    cache_salt finds nothing and gives the same text."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                       "stories_corpus.txt")
    with open(src, encoding="utf-8") as f:
        first = f.read()[:1500]
    second = first + " Then Lily asked her mom a question."
    cl = client(c)

    def cached(r):
        d = getattr(r.usage, "prompt_tokens_details", None)
        return d.cached_tokens if d is not None else None

    r1 = cl.completions.create(model=MODEL_ID, prompt=first, max_tokens=8, temperature=0)
    check(cached(r1) == 0, f"first request cached {cached(r1)}")
    want = generate(args, second, 8)
    r2 = cl.completions.create(model=MODEL_ID, prompt=second, max_tokens=8, temperature=0)
    check(cached(r2) is not None and cached(r2) >= 256 and cached(r2) % 256 == 0,
          f"second request cached {cached(r2)}")
    check(r2.choices[0].text == want, f"shared {r2.choices[0].text!r} != cold {want!r}")
    r3 = cl.completions.create(model=MODEL_ID, prompt=second, max_tokens=8, temperature=0,
                               extra_body={"cache_salt": "another-tenant"})
    check(cached(r3) == 0, f"other salt cached {cached(r3)}")
    check(r3.choices[0].text == want, f"salted {r3.choices[0].text!r} != cold {want!r}")
    s = scrape(c, "kvstored")
    check(metric(s, "freekv_store_prefix_hits_total") >= 1, "store prefix hits")
    check(metric(s, "freekv_store_prefix_tokens_saved_total") >= cached(r2), "tokens saved")


CASES = [t_models_health, t_completion_greedy, t_completion_stop_seed, t_chat, t_concurrent,
         t_bad_input, t_no_template, t_limits, t_event_loop, t_kill_worker, t_metrics, t_prefix]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"skip: no model at {args.model}")
        return 77
    c = Cluster(args.build, args.model, workers=2, gate_args=["--chat-template", "llama2"],
                worker_args=["-c", "2048", "--max-seqs", "8"], metrics=True)
    failed = 0
    try:
        c.start()
        for case in CASES:
            if args.only and args.only not in case.__name__:
                continue
            t0 = time.time()
            try:
                case(args, c)
                print(f"ok: {case.__name__} ({time.time() - t0:.1f} s)", flush=True)
                RESULTS.append(True)
            except Exception:
                traceback.print_exc()
                print(f"FAIL: {case.__name__} (logs in {c.dir})", flush=True)
                RESULTS.append(False)
                failed += 1
        codes = c.stop()
        bad = {k: v for k, v in codes.items() if v != 0 and not getattr(c.procs[k], "expected_exit", False)}
        if bad:
            print(f"FAIL: exit codes after SIGTERM: {bad} (logs in {c.dir})")
            RESULTS.append(False)
            failed += 1
        else:
            RESULTS.append(True)
    finally:
        c.cleanup(keep=failed > 0)
    print(f"{RESULTS.count(True)} passed, {RESULTS.count(False)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
