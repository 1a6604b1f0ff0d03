"""What Crossway adds over calling the upstream directly, measured side by side in one run (issue 2).

Starts, as their own processes on loopback, the fake vendor APIs (``tests.fakes.upstream``) and a
Crossway gateway in front of them (temporary SQLite database, a policy whose alias ``bench`` maps to
the fake's OpenAI endpoint, an API key made with ``crossway keys create``), optionally a LiteLLM
proxy (``--litellm``), then sends the same workloads to every target:

* ``direct``: the fake upstream itself, with the upstream's key;
* ``crossway``: the gateway, with auth and the policy lookup on;
* ``--target NAME=BASE_URL[,key=KEY][,model=MODEL][,pid=PID]``: any peer gateway (its CPU is read
  when ``pid`` is given).

Workloads: non-streamed and streamed chat completions (``json``, ``stream``) and streamed Anthropic
Messages (``messages-stream``; ``messages`` for non-streamed) at each concurrency (default 1, 16, 64):
p50/p99 total latency, p50/p99 TTFT for streams (time to the first chunk carrying content), request
rate, and the CPU time (utime+stime from ``/proc/PID/stat``) of every process involved, per request.
A final ``rate`` phase sends more non-streamed requests at concurrency 64 for the sustained rate.

The load generator is a small HTTP/1.1 keep-alive client on raw asyncio streams (uvloop when
installed): one persistent connection per concurrent worker, pre-encoded request bytes, so that it
stays cheap on a 2-core machine. Every loop is bounded in count and in time. The processes started
here are stopped by PID at the end, also on an error or Ctrl-C.

Usage::

    python -m bench.gateway_overhead                   # full run (a few minutes)
    python -m bench.gateway_overhead --quick           # smoke run (seconds)
    python -m bench.gateway_overhead --litellm /tmp/litellm-venv/bin/litellm --profile /tmp/gw.txt
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "bench" / "results" / "gateway_overhead.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
UPSTREAM_KEY = "sk-fake-openai"
UPSTREAM_MODEL = "gpt-4o-mini"  # any plain name: the fake echoes the prompt, one stream delta per word
UPSTREAM_ANTHROPIC_KEY = "sk-ant-fake"
UPSTREAM_ANTHROPIC_MODEL = "claude-bench"  # the fake's Anthropic endpoint echoes the same way
ALIAS = "bench"
MESSAGES_ALIAS = "bench-claude"
WORKLOADS = ("json", "stream", "messages", "messages-stream")
LITELLM_KEY = "sk-bench-master"
PROMPT = "Say hello to the gateway overhead benchmark please"
_CONTENT = re.compile(rb'"(?:content|text)":\s*"(?!")')  # a delta that carries text (empty openers do not)
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)


# --------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    """One endpoint that receives the workload."""

    name: str
    base_url: str
    """OpenAI base URL, ending in ``/v1`` as the SDKs take it."""
    key: str | None
    model: str
    pid: int | None = None
    """The server process whose CPU time is read, when known."""
    messages: tuple[str, str] | None = None
    """(key, model) for ``/messages`` (Anthropic wire), when the target serves it."""
    host: str = field(init=False)
    port: int = field(init=False)
    path: str = field(init=False)

    def __post_init__(self) -> None:
        url = urllib.parse.urlsplit(self.base_url)
        if url.scheme != "http" or url.hostname not in LOOPBACK:
            raise ValueError(f"target {self.name}: only http:// on loopback is benchmarked, got {self.base_url}")
        self.host = url.hostname
        self.port = url.port or 80
        self.path = url.path.rstrip("/") + "/chat/completions"

    def request_bytes(self, *, stream: bool, max_tokens: int, anthropic: bool = False) -> bytes:
        """The whole HTTP/1.1 request, encoded once (``anthropic``: to ``/messages``)."""
        key, model, path = self.key, self.model, self.path
        if anthropic:
            if self.messages is None:
                raise ValueError(f"target {self.name} has no /messages endpoint configured")
            key, model = self.messages
            path = path.removesuffix("/chat/completions") + "/messages"
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
        }
        if stream:
            body["stream"] = True
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            "Accept: text/event-stream" if stream else "Accept: application/json",
            f"Content-Length: {len(payload)}",
        ]
        if anthropic:
            head.append("anthropic-version: 2023-06-01")
            if key:
                head.append(f"x-api-key: {key}")
        elif key:
            head.append(f"Authorization: Bearer {key}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload

    def serves(self, workload: str) -> bool:
        """Whether this target gets ``workload`` (the Anthropic ones need ``messages``)."""
        return not workload.startswith("messages") or self.messages is not None


def parse_target(spec: str) -> Target:
    """``NAME=BASE_URL[,key=KEY][,model=MODEL][,pid=PID]``."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=BASE_URL[,key=KEY][,model=MODEL][,pid=PID], got {spec!r}")
    url, *options = rest.split(",")
    fields: dict[str, str] = {}
    for option in options:
        k, sep, v = option.partition("=")
        if not sep or k not in {"key", "model", "pid"}:
            raise argparse.ArgumentTypeError(f"unknown target option {option!r} (key=, model=, pid=)")
        fields[k] = v
    try:
        return Target(
            name,
            url,
            fields.get("key"),
            fields.get("model", ALIAS),
            int(fields["pid"]) if "pid" in fields else None,
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


# ------------------------------------------------------------------------------------- load generator


class Connection:
    """One persistent HTTP/1.1 connection; a worker sends one request at a time on it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.close()
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, payload: bytes, stream: bool) -> tuple[int, float, float | None]:
        """Send ``payload``, read the whole response; returns (status, total s, TTFT s or None)."""
        if self.writer is None:
            await self.open()
        reader, writer = self.reader, self.writer
        assert reader is not None
        assert writer is not None
        t0 = time.perf_counter()
        writer.write(payload)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        ttft = None
        keep = _CLOSE.search(head) is None
        if _CHUNKED.search(head):
            tail = b""
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                data = await reader.readexactly(size + 2)
                if stream and ttft is None:
                    if _CONTENT.search(tail + data):  # tail: an event may straddle two chunks
                        ttft = time.perf_counter() - t0
                    tail = data[-32:]
        elif (m := _CONTENT_LENGTH.search(head)) is not None:
            data = await reader.readexactly(int(m.group(1)))
            if stream and _CONTENT.search(data):
                ttft = time.perf_counter() - t0
        else:  # no framing: the body ends with the connection
            data = await reader.read()
            if stream and _CONTENT.search(data):
                ttft = time.perf_counter() - t0
            keep = False
        total = time.perf_counter() - t0
        if not keep:
            self.close()
        return status, total, ttft


@dataclass
class Samples:
    """What the workers of one phase measured."""

    latency: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    no_content: int = 0
    """Streams whose chunks never carried content (their TTFT is missing)."""

    @property
    def done(self) -> int:
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != 200) + sum(self.errors.values())


async def drive(
    conns: list[Connection], payload: bytes, stream: bool, count: int, seconds: float, grace_s: float
) -> tuple[Samples, float]:
    """Send ``count`` requests over ``conns`` (one worker each), stopping early after ``seconds``.

    Returns the samples and the wall time. Requests still open ``grace_s`` after the deadline are
    abandoned and counted as errors ("timeout").
    """
    samples = Samples()
    remaining = count
    start = time.perf_counter()
    deadline = start + seconds
    in_flight = 0

    async def worker(conn: Connection) -> None:
        nonlocal remaining, in_flight
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            in_flight += 1
            try:
                status, total, ttft = await conn.request(payload, stream)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                samples.errors[type(exc).__name__] += 1
                conn.close()
                await asyncio.sleep(0.01)  # a refused connection must not spin
                continue
            finally:
                in_flight -= 1
            samples.statuses[status] += 1
            if status != 200:
                continue
            samples.latency.append(total)
            if stream:
                if ttft is None:
                    samples.no_content += 1
                else:
                    samples.ttft.append(ttft)

    try:
        async with asyncio.timeout(seconds + grace_s):
            await asyncio.gather(*(worker(c) for c in conns))
    except TimeoutError:
        samples.errors["timeout"] += in_flight
        for c in conns:
            c.close()
    return samples, time.perf_counter() - start


# ------------------------------------------------------------------------------------------ CPU times


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads) in seconds, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from ``/proc/stat``.

    Busy is user + nice + system + irq + softirq: what every process here, ours or not, spent.
    """
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]] + [0] * 8
    return (values[0] + values[1] + values[2] + values[5] + values[6]) / CLK_TCK, values[7] / CLK_TCK


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    snap: dict[str, float | None] = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    snap["_machine_busy"], snap["_machine_steal"] = machine_busy_s()
    return snap


# -------------------------------------------------------------------------------------------- phases


@dataclass
class Phase:
    """The plan for one measured phase."""

    name: str
    workload: str
    """``json`` or ``stream``."""
    concurrency: int
    requests: int
    seconds: float


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile in milliseconds."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] * 1000


async def run_phase(
    target: Target, phase: Phase, pids: dict[str, int], warmup: int, max_tokens: int, grace_s: float
) -> dict[str, Any]:
    stream = phase.workload.endswith("stream")
    payload = target.request_bytes(
        stream=stream, max_tokens=max_tokens, anthropic=phase.workload.startswith("messages")
    )
    conns = [Connection(target.host, target.port) for _ in range(phase.concurrency)]
    try:
        await asyncio.gather(*(c.open() for c in conns), return_exceptions=True)  # failures retry in drive
        await drive(conns, payload, stream, max(warmup, 2 * phase.concurrency), 3.0, grace_s)
        before = cpu_snapshot(pids)
        samples, wall = await drive(conns, payload, stream, phase.requests, phase.seconds, grace_s)
        after = cpu_snapshot(pids)
    finally:
        for c in conns:
            c.close()
    done = max(samples.done, 1)
    cpu: dict[str, dict[str, float] | None] = {}
    for name in pids:
        b, a = before[name], after[name]
        cpu[name] = None if a is None or b is None else {"s": a - b, "ms_per_request": (a - b) * 1000 / done}
    busy_before, busy_after = before["_machine_busy"], after["_machine_busy"]
    assert busy_before is not None
    assert busy_after is not None
    busy = busy_after - busy_before
    by_pid = {pids[name]: v["s"] for name, v in cpu.items() if v is not None}  # a target may be "upstream" too
    known = sum(by_pid.values())
    steal_before, steal_after = before["_machine_steal"], after["_machine_steal"]
    steal = (steal_after or 0.0) - (steal_before or 0.0)
    result: dict[str, Any] = {
        "target": target.name,
        "phase": phase.name,
        "workload": phase.workload,
        "concurrency": phase.concurrency,
        "requests": samples.done,
        "ok": len(samples.latency),
        "failed": samples.failed,
        "statuses": {str(k): v for k, v in samples.statuses.items()},
        "errors": dict(samples.errors),
        "wall_s": wall,
        "rps": samples.done / wall if wall > 0 else None,
        "latency_ms": {
            "p50": pct(samples.latency, 50),
            "p90": pct(samples.latency, 90),
            "p99": pct(samples.latency, 99),
        },
        "cpu": cpu,
        "server_cpu_ms_per_request": (cpu.get(target.name) or {}).get("ms_per_request"),
        "machine_busy_cores": busy / wall if wall > 0 else None,
        "other_busy_cores": max(0.0, busy - known) / wall if wall > 0 else None,
        "steal_cores": steal / wall if wall > 0 else None,
    }
    if stream:
        result["ttft_ms"] = {"p50": pct(samples.ttft, 50), "p90": pct(samples.ttft, 90), "p99": pct(samples.ttft, 99)}
        result["streams_without_content"] = samples.no_content
    return result


def plan_phases(args: argparse.Namespace) -> list[Phase]:
    phases = []
    for workload in args.workloads:
        for c in args.concurrency:
            count = args.requests[min(len(args.requests) - 1, args.concurrency.index(c))]
            phases.append(Phase(f"{workload}-c{c}", workload, c, count, args.duration))
    if args.rate_requests > 0:
        phases.append(Phase("rate-c64", "json", 64, args.rate_requests, args.rate_duration))
    return phases


async def preflight(target: Target, max_tokens: int) -> None:
    """One request of each kind; a target that does not answer 200 stops the run with the reason."""
    for anthropic, stream in ((False, False), (False, True), (True, False), (True, True)):
        if anthropic and target.messages is None:
            continue
        conn = Connection(target.host, target.port)
        try:
            async with asyncio.timeout(30):
                payload = target.request_bytes(stream=stream, max_tokens=max_tokens, anthropic=anthropic)
                status, _, ttft = await conn.request(payload, stream)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise RuntimeError(f"target {target.name} ({target.base_url}): {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if status != 200:
            raise RuntimeError(f"target {target.name} ({target.base_url}) answered {status} (check key= and model=)")
        if stream and ttft is None:
            raise RuntimeError(f"target {target.name}: its stream carried no content chunk")


async def measure(args: argparse.Namespace, targets: list[Target], pids: dict[str, int]) -> list[dict[str, Any]]:
    """Every phase on every target, the targets one after another inside each phase."""
    for target in targets:
        await preflight(target, args.max_tokens)
    results = []
    for phase in plan_phases(args):
        for target in (t for t in targets if t.serves(phase.workload)):
            r = await run_phase(target, phase, pids, args.warmup, args.max_tokens, args.grace)
            results.append(r)
            ttft = r.get("ttft_ms", {}).get("p50")
            print(
                f"  {phase.name:<10} {target.name:<10} n={r['requests']:<6} failed={r['failed']:<4} "
                f"p50={_ms(r['latency_ms']['p50'])} p99={_ms(r['latency_ms']['p99'])}"
                + (f" ttft50={_ms(ttft)}" if phase.workload.endswith("stream") else "")
                + f" rps={r['rps']:.0f} cpu/req={_ms(r['server_cpu_ms_per_request'])}",
                flush=True,
            )
    return results


# ---------------------------------------------------------------------------------------- processes


class Processes:
    """The child processes this run started; ``stop`` ends exactly those, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.started.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for _, proc in reversed(self.started):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.started):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.started.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(proc: subprocess.Popen[bytes], port: int, path: str, headers: dict[str, str], timeout_s: float) -> None:
    """Wait until ``GET path`` answers 200, or fail if the process exits or the time runs out."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    ).encode()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(request)
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                return
        time.sleep(0.2)
    raise RuntimeError(f"127.0.0.1:{port}{path} did not answer 200 within {timeout_s:.0f} s")


def clean_env() -> dict[str, str]:
    """The environment without anything that would change the gateway's setup."""
    drop = ("CROSSWAY_", "REDIS_URL", "DATABASE_URL", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_GEMINI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_upstream(procs: Processes) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = procs.start("upstream", [sys.executable, "-m", "tests.fakes.upstream", "--port", str(port)], clean_env())
    try:
        wait_http(proc, port, "/v1/models", {"Authorization": f"Bearer {UPSTREAM_KEY}"}, 30)
    except RuntimeError as exc:
        raise RuntimeError(f"fake upstream did not start: {exc}\n{procs.log_tail('upstream')}") from exc
    return proc, port


def start_crossway(procs: Processes, upstream_port: int, log_level: str) -> tuple[subprocess.Popen[bytes], int, str]:
    workdir = procs.workdir
    policy = workdir / "policy.yaml"
    policy.write_text(
        "version: 1\npassthrough: false\nproviders:\n  fake:\n    kind: openai\n"
        f"    base_url: http://127.0.0.1:{upstream_port}/v1\n    api_key_env: BENCH_UPSTREAM_KEY\n"
        "  fake-anthropic:\n    kind: anthropic\n"
        f"    base_url: http://127.0.0.1:{upstream_port}\n    api_key_env: BENCH_UPSTREAM_ANTHROPIC_KEY\n"
        f"models:\n  {ALIAS}:\n    targets: [{{provider: fake, model: {UPSTREAM_MODEL}}}]\n"
        f"  {MESSAGES_ALIAS}:\n    targets: [{{provider: fake-anthropic, model: {UPSTREAM_ANTHROPIC_MODEL}}}]\n"
    )
    env = clean_env() | {
        "DATABASE_URL": f"sqlite+aiosqlite:///{workdir / 'crossway.db'}",
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "BENCH_UPSTREAM_ANTHROPIC_KEY": UPSTREAM_ANTHROPIC_KEY,
        "CROSSWAY_LOG_LEVEL": log_level,
    }
    return serve_crossway(procs, policy, env)


def serve_crossway(procs: Processes, policy: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int, str]:
    """Create an API key, then run ``crossway serve`` on ``policy`` until healthy: (process, port, key)."""
    cli = [sys.executable, "-m", "gateway.cli"]
    made = subprocess.run(
        [*cli, "keys", "create", "--tenant", "bench"], cwd=REPO, env=env, capture_output=True, timeout=120, check=False
    )
    key = made.stdout.decode().strip()
    if made.returncode != 0 or not key:
        raise RuntimeError(f"crossway keys create failed ({made.returncode}): {made.stderr.decode()[-2000:]}")
    port = free_port()
    proc = procs.start(
        "crossway", [*cli, "serve", "--host", "127.0.0.1", "--port", str(port), "--policy", str(policy)], env
    )
    try:
        wait_http(proc, port, "/healthz", {}, 60)
    except RuntimeError as exc:
        raise RuntimeError(f"crossway did not start: {exc}\n{procs.log_tail('crossway')}") from exc
    return proc, port, key


def start_litellm(procs: Processes, binary: str, upstream_port: int) -> tuple[subprocess.Popen[bytes], int]:
    config = procs.workdir / "litellm.yaml"
    config.write_text(
        f"model_list:\n  - model_name: {ALIAS}\n    litellm_params:\n      model: openai/{UPSTREAM_MODEL}\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n      api_key: {UPSTREAM_KEY}\n"
        f"general_settings:\n  master_key: {LITELLM_KEY}\nlitellm_settings:\n  telemetry: false\n"
    )
    env = clean_env() | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    port = free_port()
    argv = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    proc = procs.start("litellm", argv, env, cwd=procs.workdir)
    try:
        wait_http(proc, port, "/health/liveliness", {}, 120)
    except RuntimeError as exc:
        raise RuntimeError(f"litellm did not start: {exc}\n{procs.log_tail('litellm')}") from exc
    return proc, port


# -------------------------------------------------------------------------------------------- profile


def find_py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


async def profile_crossway(
    args: argparse.Namespace, procs: Processes, crossway: Target, pids: dict[str, int]
) -> dict[str, Any] | None:
    """py-spy (GIL-holding samples only: CPU, not waiting) over the gateway under JSON, then streamed, load at concurrency 16.

    ``--profile X.svg`` writes a flame graph; any other name gets py-spy's collapsed stacks
    (``--format raw``), summarized here per function and per module.
    """
    py_spy = find_py_spy()
    if py_spy is None:
        print("  py-spy not found (pip install py-spy): no profile")
        return None
    seconds = max(4, int(args.profile_seconds))
    out = str(args.profile)
    fmt = "flamegraph" if out.endswith(".svg") else "raw"
    argv = [py_spy, "record", "--pid", str(crossway.pid), "--rate", "250", "--gil", "--format", fmt, "--output", out]
    spy = procs.start("py-spy", [*argv, "--duration", str(seconds)], clean_env())
    print(f"\nprofiling crossway (pid {crossway.pid}) with py-spy for {seconds} s -> {out}")
    await asyncio.sleep(1.0)  # let it attach
    half = Phase("profile", "json", 16, 1_000_000, (seconds - 2) / 2)
    await run_phase(crossway, half, pids, 0, args.max_tokens, args.grace)
    half.workload = "stream"
    await run_phase(crossway, half, pids, 0, args.max_tokens, args.grace)
    await asyncio.to_thread(spy.wait, seconds + 30)
    summary = summarize_collapsed(Path(out), top=args.profile_top) if fmt == "raw" else {"flamegraph": out}
    if summary is None:
        print(f"  py-spy wrote nothing:\n{procs.log_tail('py-spy')}")
    elif fmt == "raw":
        print_profile(summary)
    return summary


def summarize_collapsed(path: Path, top: int = 25) -> dict[str, Any] | None:
    """Sample shares from py-spy's ``raw`` (collapsed stacks) output.

    ``self_pct``: the function on top of the stack; ``package_self_pct``: the same summed per
    package (``gateway`` per module), which adds up to 100; ``inclusive_pct``: functions anywhere on
    the stack, leaving out the entry chain present in nearly every sample.
    """
    if not path.exists():
        return None
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        count = int(n)
        total += count
        own[frames[-1][0]] += count
        packages[_package(frames[-1][1])] += count
        for name in {f[0] for f in frames}:
            inclusive[name] += count

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in counter.most_common(top)] if total else []

    body = Counter({k: v for k, v in inclusive.items() if v < 0.95 * total})
    return {
        "samples": total,
        "self_pct": share(own),
        "package_self_pct": share(packages),
        "inclusive_pct": share(body),
    }


def _frame(frame: str) -> tuple[str, str]:
    """``func (path/to/file.py:12)`` -> (``func (module)``, module)."""
    func, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rstrip(")")
    for marker in ("site-packages/", "/lib/python3.", str(REPO) + "/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            if marker == "/lib/python3.":
                file = file.partition("/")[2]  # 11/asyncio/tasks.py -> asyncio/tasks.py
            break
    module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{func} ({module})", module


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "gateway" else parts[0]


def print_profile(summary: dict[str, Any]) -> None:
    print(f"\nGateway profile (py-spy, {summary['samples']} samples holding the GIL)")
    for title, key in (
        ("self, per function", "self_pct"),
        ("self, per package", "package_self_pct"),
        ("inclusive", "inclusive_pct"),
    ):
        print(f"  top {title}:")
        for name, share in summary[key][:15]:
            print(f"    {share:5.1f}%  {name}")


# -------------------------------------------------------------------------------------------- report


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def overhead(results: list[dict[str, Any]], baseline: str = "direct") -> list[dict[str, Any]]:
    """Per phase and non-baseline target: its figure minus the baseline's."""
    base = {r["phase"]: r for r in results if r["target"] == baseline}
    rows = []
    for r in results:
        b = base.get(r["phase"])
        if r["target"] == baseline or b is None:
            continue
        row: dict[str, Any] = {
            "target": r["target"],
            "phase": r["phase"],
            "p50_ms": _diff(r["latency_ms"]["p50"], b["latency_ms"]["p50"]),
            "p99_ms": _diff(r["latency_ms"]["p99"], b["latency_ms"]["p99"]),
            "rps_ratio": r["rps"] / b["rps"] if r["rps"] and b["rps"] else None,
            "cpu_ms_per_request": r["server_cpu_ms_per_request"],
        }
        if "ttft_ms" in r:
            row["ttft_p50_ms"] = _diff(r["ttft_ms"]["p50"], b["ttft_ms"]["p50"])
            row["ttft_p99_ms"] = _diff(r["ttft_ms"]["p99"], b["ttft_ms"]["p99"])
        rows.append(row)
    return rows


def goals(results: list[dict[str, Any]], over: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 2's goals for the ``crossway`` target."""
    cw = [r for r in results if r["target"] == "crossway"]
    ov = {o["phase"]: o for o in over if o["target"] == "crossway"}
    cpu = [r["server_cpu_ms_per_request"] for r in cw if r["server_cpu_ms_per_request"] is not None]
    rate = next((r["rps"] for r in cw if r["phase"] == "rate-c64"), None)
    if rate is None:
        rate = next((r["rps"] for r in cw if r["phase"] == "json-c64"), None)
    json1 = ov.get("json-c1", {}).get("p50_ms")
    ttft1 = ov.get("stream-c1", {}).get("ttft_p50_ms")
    ttft1_messages = ov.get("messages-stream-c1", {}).get("ttft_p50_ms")

    def check(value: float | None, ok: bool) -> dict[str, Any]:
        return {"measured": value, "met": None if value is None else ok}

    return {
        "cpu_ms_per_request_max_under_1": check(max(cpu) if cpu else None, bool(cpu) and max(cpu) < 1),
        "p50_overhead_json_c1_under_1ms": check(json1, json1 is not None and json1 < 1),
        "p50_overhead_stream_ttft_c1_under_1ms": check(ttft1, ttft1 is not None and ttft1 < 1),
        "p50_overhead_messages_stream_ttft_c1_under_1ms": check(
            ttft1_messages, ttft1_messages is not None and ttft1_messages < 1
        ),
        "rps_c64_over_1000": check(rate, rate is not None and rate > 1000),
    }


TITLES = {
    "json": "non-streamed chat completion",
    "stream": "streamed chat completion",
    "messages": "non-streamed Anthropic message",
    "messages-stream": "streamed Anthropic message",
}


def print_report(report: dict[str, Any]) -> None:
    results = report["results"]
    names = list(dict.fromkeys(r["target"] for r in results))
    for workload, title in TITLES.items():
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        stream = workload.endswith("stream")
        print(f"\n{title}: latency in ms; CPU in ms of CPU time per request; busy = cores busy machine-wide,")
        print("other = of those, cores used by processes this run did not start")
        head = f"{'phase':<10} {'target':<10} {'n':>6} {'fail':>5} {'p50':>7} {'p99':>7}"
        head += f" {'ttft50':>7} {'ttft99':>7}" if stream else ""
        head += f" {'req/s':>7} {'srv CPU':>8} {'upstr CPU':>9} {'load CPU':>8} {'busy':>5} {'other':>5}"
        print(head)
        for phase in dict.fromkeys(r["phase"] for r in rows):
            for name in names:
                r = next((x for x in rows if x["phase"] == phase and x["target"] == name), None)
                if r is None:
                    continue
                line = f"{phase:<10} {name:<10} {r['requests']:>6} {r['failed']:>5} "
                line += f"{_ms(r['latency_ms']['p50']):>7} {_ms(r['latency_ms']['p99']):>7}"
                if stream:
                    line += f" {_ms(r['ttft_ms']['p50']):>7} {_ms(r['ttft_ms']['p99']):>7}"
                up = (r["cpu"].get("upstream") or {}).get("ms_per_request")
                lg = (r["cpu"].get("loadgen") or {}).get("ms_per_request")
                line += f" {r['rps']:>7.0f} {_ms(r['server_cpu_ms_per_request']):>8} {_ms(up):>9} {_ms(lg):>8}"
                line += f" {r['machine_busy_cores']:>5.2f} {r['other_busy_cores']:>5.2f}"
                print(line)
            for o in (o for o in report["overhead"] if o["phase"] == phase):
                line = f"{'':<10} {'+' + o['target']:<10} {'':>6} {'':>5} {_signed(o['p50_ms']):>7} {_signed(o['p99_ms']):>7}"
                if stream:
                    line += f" {_signed(o.get('ttft_p50_ms')):>7} {_signed(o.get('ttft_p99_ms')):>7}"
                ratio = o["rps_ratio"]
                line += f" {'x' + format(ratio, '.2f') if ratio else '-':>7}"
                print(line)
    print("\nGoals (issue 2, crossway):")
    for name, g in report["goals"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        value = "-" if g["measured"] is None else f"{g['measured']:.2f}"
        print(f"  {name:<40} {value:>9}  {verdict}")


def markdown(report: dict[str, Any]) -> str:
    """The figures as Markdown tables, for ``docs/benchmarks.md``."""
    results, over = report["results"], report["overhead"]
    out = []
    for workload in TITLES:
        rows = [r for r in results if r["workload"] == workload]
        if not rows:
            continue
        stream = workload.endswith("stream")
        cols = ["phase", "target", "n", "p50 ms", "p99 ms"]
        cols += ["TTFT p50", "TTFT p99"] if stream else []
        cols += ["req/s", "server CPU ms/req", "upstream CPU ms/req", "loadgen CPU ms/req", "other cores busy"]
        out += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            cells = [
                r["phase"],
                r["target"],
                str(r["requests"]),
                _ms(r["latency_ms"]["p50"]),
                _ms(r["latency_ms"]["p99"]),
            ]
            if stream:
                cells += [_ms(r["ttft_ms"]["p50"]), _ms(r["ttft_ms"]["p99"])]
            cells += [
                f"{r['rps']:.0f}",
                _ms(r["server_cpu_ms_per_request"]),
                _ms((r["cpu"].get("upstream") or {}).get("ms_per_request")),
                _ms((r["cpu"].get("loadgen") or {}).get("ms_per_request")),
                _ms(r["other_busy_cores"]),
            ]
            out.append("| " + " | ".join(cells) + " |")
    cols = ["phase", "gateway", "p50 +ms", "p99 +ms", "TTFT p50 +ms", "TTFT p99 +ms", "req/s vs direct", "CPU ms/req"]
    out += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for o in over:
        ratio = "-" if o["rps_ratio"] is None else f"x{o['rps_ratio']:.3f}"
        cells = [o["phase"], o["target"], _signed(o["p50_ms"]), _signed(o["p99_ms"])]
        cells += [_signed(o.get("ttft_p50_ms")), _signed(o.get("ttft_p99_ms")), ratio, _ms(o["cpu_ms_per_request"])]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out).lstrip("\n") + "\n"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def machine_info() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    mem = re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.MULTILINE)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=False)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_model": models[0] if models else platform.processor(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "mem_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit.stdout.strip() or None,
        "git_dirty": bool(dirty.stdout.strip()),
    }


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: small counts, short caps")
    p.add_argument(
        "--target", action="append", type=parse_target, default=[], metavar="NAME=URL[,key=K][,model=M][,pid=P]"
    )
    p.add_argument("--litellm", metavar="BIN", help="start this LiteLLM proxy binary (its own venv) as a peer target")
    p.add_argument("--no-crossway", action="store_true", help="measure only direct and the peers")
    p.add_argument("--concurrency", type=_ints, default=[1, 16, 64], metavar="1,16,64")
    p.add_argument("--requests", type=_ints, default=None, metavar="N[,N...]", help="per phase, one per concurrency")
    p.add_argument("--duration", type=float, default=None, help="cap in seconds per measured phase")
    p.add_argument("--rate-requests", type=int, default=None, help="requests in the rate phase (0: skip)")
    p.add_argument("--rate-duration", type=float, default=None, help="cap in seconds of the rate phase")
    p.add_argument(
        "--workloads",
        type=_workloads,
        default=["json", "stream", "messages-stream"],
        metavar="json,stream,messages-stream",
        help=f"any of {', '.join(WORKLOADS)}",
    )
    p.add_argument("--warmup", type=int, default=None, help="warm-up requests before each phase")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--grace", type=float, default=15.0, help="seconds open requests get after a phase's cap")
    p.add_argument(
        "--gateway-log-level", default="info", help="CROSSWAY_LOG_LEVEL of the gateway (default: as shipped)"
    )
    p.add_argument("--profile", metavar="PATH", help="after measuring, py-spy the gateway under load into PATH")
    p.add_argument("--profile-seconds", type=float, default=20)
    p.add_argument("--profile-top", type=int, default=25)
    p.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON.relative_to(REPO)})"
    )
    p.add_argument("--markdown", type=Path, metavar="PATH", help="also write the tables as Markdown")
    p.add_argument("--render", type=Path, metavar="JSON", help="print a results file as Markdown and exit")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temp dir (logs, database, policy)")
    return p


def _workloads(value: str) -> list[str]:
    names = [v for v in value.split(",") if v]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def _ints(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v]


def resolve_defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    if args.requests is None:
        args.requests = [60, 200, 400] if quick else [1500, 3000, 4000]
    if args.duration is None:
        args.duration = 3.0 if quick else 12.0
    if args.rate_requests is None:
        args.rate_requests = 300 if quick else 8000
    if args.rate_duration is None:
        args.rate_duration = 3.0 if quick else 15.0
    if args.warmup is None:
        args.warmup = 10 if quick else 200


async def main_async(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    print(f"workdir {procs.workdir}")
    upstream, up_port = start_upstream(procs)
    print(f"fake upstream  pid {upstream.pid}  http://127.0.0.1:{up_port}/v1")
    pids = {"loadgen": os.getpid(), "upstream": upstream.pid}
    targets = [
        Target(
            "direct",
            f"http://127.0.0.1:{up_port}/v1",
            UPSTREAM_KEY,
            UPSTREAM_MODEL,
            upstream.pid,
            messages=(UPSTREAM_ANTHROPIC_KEY, UPSTREAM_ANTHROPIC_MODEL),
        )
    ]
    crossway = None
    if not args.no_crossway:
        gw, gw_port, key = start_crossway(procs, up_port, args.gateway_log_level)
        print(f"crossway       pid {gw.pid}  http://127.0.0.1:{gw_port}/v1  (key {key[:8]}...)")
        crossway = Target(
            "crossway", f"http://127.0.0.1:{gw_port}/v1", key, ALIAS, gw.pid, messages=(key, MESSAGES_ALIAS)
        )
        targets.append(crossway)
    if args.litellm:
        ll, ll_port = start_litellm(procs, args.litellm, up_port)
        print(f"litellm        pid {ll.pid}  http://127.0.0.1:{ll_port}/v1")
        targets.append(Target("litellm", f"http://127.0.0.1:{ll_port}/v1", LITELLM_KEY, ALIAS, ll.pid))
    for t in args.target:
        print(f"peer           pid {t.pid or '?'}  {t.base_url}")
        targets.append(t)
    for t in targets:
        if t.pid is not None:
            pids.setdefault(t.name, t.pid)
    print("measuring (each phase: direct, then each gateway)")
    results = await measure(args, targets, pids)
    over = overhead(results)
    report: dict[str, Any] = {
        "benchmark": "gateway_overhead",
        "command": " ".join(["python", "-m", "bench.gateway_overhead", *sys.argv[1:]]),
        "machine": machine_info(),
        "config": {
            "quick": args.quick,
            "concurrency": args.concurrency,
            "requests": args.requests,
            "duration_cap_s": args.duration,
            "rate_requests": args.rate_requests,
            "rate_duration_cap_s": args.rate_duration,
            "warmup": args.warmup,
            "max_tokens": args.max_tokens,
            "prompt": PROMPT,
            "upstream_model": UPSTREAM_MODEL,
            "gateway_log_level": args.gateway_log_level,
            "load_generator": f"raw asyncio HTTP/1.1 keep-alive, {_loop_name()}",
        },
        "targets": [{k: v for k, v in asdict(t).items() if k != "key"} for t in targets],
        "results": results,
        "overhead": over,
        "goals": goals(results, over),
    }
    if args.profile and crossway is not None:
        report["profile"] = await profile_crossway(args, procs, crossway, pids)
    return report


def _loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio event loop"
    return "uvloop"


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_measurement(
    name: str,
    workdir: Path,
    work: Callable[[Processes], Coroutine[Any, Any, dict[str, Any]]],
    after: Callable[[], None],
) -> dict[str, Any] | int:
    """Run ``work`` on a fresh event loop with the processes it starts, which are always stopped (then ``after``).

    Returns its report, or an exit code when it was interrupted (130) or failed (1, said on stderr).
    """
    procs = Processes(workdir)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(work(procs))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    finally:
        procs.stop()
        after()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.render:
        print(markdown(json.loads(args.render.read_text())), end="")
        return 0
    resolve_defaults(args)
    workdir = Path(tempfile.mkdtemp(prefix="crossway-bench-"))

    def cleanup() -> None:
        if args.keep_workdir:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    report = run_measurement("gateway_overhead", workdir, lambda procs: main_async(args, procs), cleanup)
    if isinstance(report, int):
        return report
    print_report(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(report))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
