"""`fedveil bench serve`: the prediction service against calling the model directly.

    .venv/bin/python -m fedveil.benchmarks.bench_serve --json [--quick]

The model is the default simulate task's (the Fashion-MNIST CNN, random weights: speed does
not depend on them). Three processes: this one (the direct baseline, then the conductor),
`fedveil serve` (as a user starts it: --insecure --public on loopback, default batching
flags unless given), and the load generator, in its own process so its CPU is its own and
reported (user+sys seconds over wall seconds, of one core).

- direct: `model(x)` on batches of the request size, back to back, under inference_mode,
  in this process (torch's default threads), nothing else running.
- served, closed loop: C connections (keep-alive) each sending the next request when its
  reply arrives; rows per second over the window, for NPZ bodies of 32 and 256 images and
  JSON bodies of 32. Saturation: the best over the concurrencies tried.
- latency: open loop at increasing offered rates (fractions of the saturated NPZ-32 request
  rate), Poisson arrivals; latency counts from each request's scheduled time, so a slow
  server is not hidden by a generator that waits for it (coordinated omission).
- merged batch sizes: the server's own /metrics (rows per forward pass), per phase.
- cpu_efficiency_ratio: rows per CPU-second of the server process over the direct loop's;
  on a machine others load too, a server with more threads may get more CPU than the
  one-thread direct loop, which favours the served rate; this ratio does not depend on it.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import queue
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedveil.benchmarks.harness import command_main, int_list, print_report

SHAPE = (1, 28, 28)
CLASSES = 10
TARGET_RATIO = 0.8
STARTUP = re.compile(r"fedveil serve: (\S+) .* on http://([^/\s:]+):(\d+)/")
RATE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.2)
QUICK_FRACTIONS = (0.25, 0.5, 1.0)


# -- the model and the direct baseline ----------------------------------------------------
def write_model(folder: Path, seed: int) -> Path:
    """The default task's CNN with random weights, as a run writes it (with metadata)."""
    import torch

    from fedveil.builtin_models import build_model
    from fedveil.config import RunConfig
    from fedveil.flat_model import FlatModel

    cfg = RunConfig()
    torch.manual_seed(seed)
    flat = FlatModel(build_model(cfg.model.name, SHAPE, CLASSES))
    path = folder / "model.safetensors"
    meta = {
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
        "task": f"{cfg.data.dataset}/{cfg.model.name}",
        "input_shape": json.dumps(list(SHAPE)),
        "num_classes": str(CLASSES),
    }
    flat.save(flat.get(), str(path), metadata=meta)
    return path


def direct_rows_per_s(path: Path, rows: int, seconds: float, threads: int) -> dict[str, float]:
    """`model(x)` back to back on batches of `rows` for about `seconds`, on `threads`."""
    import torch

    from fedveil.server.serving.loading import load_model_file

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, _ = load_model_file(path)
        x = torch.randn(rows, *SHAPE)
        with torch.inference_mode():
            for _ in range(3):
                model(x)
            calls, start, cpu0 = 0, time.perf_counter(), time.process_time()
            while (elapsed := time.perf_counter() - start) < seconds or calls < 5:
                model(x)
                calls += 1
            cpu = time.process_time() - cpu0
    finally:
        torch.set_num_threads(before)
    return {
        "rows_per_s": calls * rows / elapsed,
        "ms_per_batch": 1000 * elapsed / calls,
        "cpu_share": cpu / elapsed,
        "rows_per_cpu_s": calls * rows / max(cpu, 1e-9),
    }


def direct_best(path: Path, rows: int, seconds: float) -> dict[str, Any]:
    """The direct baseline: the faster of one thread and torch's default (one per core)."""
    import torch

    tried = {
        t: direct_rows_per_s(path, rows, seconds, t) for t in sorted({1, torch.get_num_threads()})
    }
    best = max(tried, key=lambda t: tried[t]["rows_per_s"])
    return tried[best] | {
        "torch_threads": best,
        "by_threads": {str(t): v for t, v in tried.items()},
    }


# -- the load generator (its own process) -------------------------------------------------
def request_body(rows: int, fmt: str, seed: int = 0) -> tuple[bytes, str]:
    x = np.random.default_rng(seed).standard_normal((rows, *SHAPE)).astype(np.float32)
    if fmt == "npz":
        buf = io.BytesIO()
        np.savez(buf, inputs=x)
        return buf.getvalue(), "application/x-npz"
    return json.dumps({"inputs": x.tolist()}).encode(), "application/json"


class _Client:
    """One keep-alive connection sending one prepared request."""

    def __init__(self, host: str, port: int, path: str, body: bytes, ctype: str) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        self.path, self.body = path, body
        self.headers = {"Content-Type": ctype, "Content-Length": str(len(body))}

    def send(self) -> bool:
        self.conn.request("POST", self.path, self.body, self.headers)
        reply = self.conn.getresponse()
        reply.read()
        return reply.status == 200


def closed_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """C connections back to back for `seconds`."""
    body, ctype = request_body(spec["rows"], spec["format"])
    stop = time.perf_counter() + spec["warmup"] + spec["seconds"]
    measure_from = time.perf_counter() + spec["warmup"]
    done, errors, latencies, lock = [0], [0], [], threading.Lock()

    def worker() -> None:
        client = _Client(spec["host"], spec["port"], spec["path"], body, ctype)
        mine, bad, lat = 0, 0, []
        while (t0 := time.perf_counter()) < stop:
            ok = client.send()
            t1 = time.perf_counter()
            if t0 >= measure_from:
                mine, bad = mine + ok, bad + (not ok)
                lat.append(t1 - t0)
        with lock:
            done[0] += mine
            errors[0] += bad
            latencies.extend(lat)

    threads = [threading.Thread(target=worker) for _ in range(spec["concurrency"])]
    cpu0 = time.process_time()  # every thread of this process, finer than os.times()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = time.process_time()
    wall = spec["seconds"]
    lat = np.asarray(latencies) if latencies else np.zeros(1)
    return {
        "requests_per_s": done[0] / wall,
        "rows_per_s": done[0] * spec["rows"] / wall,
        "errors": errors[0],
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "loadgen_cpu_share": (cpu1 - cpu0) / (spec["warmup"] + spec["seconds"]),
    }


def open_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """Poisson arrivals at `rate` requests/s for `seconds`; latency from scheduled time."""
    body, ctype = request_body(spec["rows"], spec["format"])
    rate, seconds = spec["rate"], spec["seconds"]
    rng = random.Random(spec.get("seed", 0))
    arrivals: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    start = time.perf_counter() + 0.2
    t, count = start, 0
    while t < start + seconds:
        arrivals.put(t)
        count += 1
        t += rng.expovariate(rate)
    workers = spec["workers"]
    for _ in range(workers):
        arrivals.put(None)
    latencies: list[float] = []
    errors, lock = [0], threading.Lock()

    def worker() -> None:
        client = _Client(spec["host"], spec["port"], spec["path"], body, ctype)
        lat, bad = [], 0
        while (due := arrivals.get()) is not None:
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            ok = client.send()
            lat.append(time.perf_counter() - due)
            bad += not ok
        with lock:
            latencies.extend(lat)
            errors[0] += bad

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    cpu0 = time.process_time()  # every thread of this process, finer than os.times()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    cpu1 = time.process_time()
    wall = time.perf_counter() - start
    lat = np.asarray(latencies)
    return {
        "offered_rps": rate,
        "achieved_rps": len(lat) / wall,
        "requests": len(lat),
        "errors": errors[0],
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "loadgen_cpu_share": (cpu1 - cpu0) / wall,
    }


def run_loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one load phase in a fresh process (the load generator's own)."""
    done = subprocess.run(
        [sys.executable, "-m", "fedveil.benchmarks.bench_serve", "--loadgen", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=spec.get("seconds", 10) * 4 + 120,
        env=_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    paths = [root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


# -- the server ---------------------------------------------------------------------------
class Server:
    """`fedveil serve` on loopback, as a user starts it."""

    def __init__(self, model: Path, log: Path, extra: list[str]) -> None:
        from fedveil.ops.procs import spawn

        argv = [sys.executable, "-m", "fedveil.cli.main", "serve", "--model", str(model)]
        argv += ["--insecure", "--public", "--port", "0", *extra]
        with log.open("wb") as out:
            self.proc = spawn(argv, env=_env(), log=out)
        deadline = time.monotonic() + 120
        while not (found := STARTUP.search(log.read_text(errors="replace"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fedveil serve did not start:\n{log.read_text()}")
            time.sleep(0.1)
        self.name, self.host, self.port = found.group(1), found.group(2), int(found.group(3))
        self.path = f"/v1/models/{self.name}/predict"

    def metrics(self) -> dict[str, float]:
        """rows per forward pass (sum, count), and the server process's CPU seconds."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {"cpu_s": _proc_cpu(self.proc.pid)}
        for key in ("sum", "count"):
            m = re.search(rf"^fedveil_serve_batch_rows_{key}{{[^}}]*}} (\S+)$", text, re.M)
            out[key] = float(m.group(1)) if m else 0.0
        buckets = re.findall(
            r'^fedveil_serve_batch_rows_bucket{[^}]*le="([^"]+)"} (\S+)$', text, re.M
        )
        out["buckets"] = {le: float(v) for le, v in buckets}
        return out

    def stop(self) -> None:
        from fedveil.ops.procs import stop_group

        stop_group(self.proc)


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase(server: Server, spec: dict[str, Any]) -> dict[str, Any]:
    """One load phase with the server's merged batch sizes and CPU over it."""
    before = server.metrics()
    t0 = time.perf_counter()
    result = run_loadgen({**spec, "host": server.host, "port": server.port, "path": server.path})
    wall = time.perf_counter() - t0
    after = server.metrics()
    batches = after["count"] - before["count"]
    result["merged_batch_rows_mean"] = (after["sum"] - before["sum"]) / batches if batches else 0
    result["forward_passes"] = int(batches)
    result["server_cpu_share"] = (after["cpu_s"] - before["cpu_s"]) / wall
    # Forward passes of at most `le` rows during the phase (cumulative, as Prometheus).
    dist = {le: after["buckets"][le] - before["buckets"].get(le, 0) for le in after["buckets"]}
    result["merged_batch_rows_cumulative"] = {le: int(n) for le, n in dist.items() if n}
    return result


# -- the benchmark ------------------------------------------------------------------------
KINDS = (("npz_32", 32, "npz"), ("npz_256", 256, "npz"), ("json_32", 32, "json"))


def run_benchmark(
    *,
    seconds: float,
    concurrencies: list[int],
    fractions: tuple[float, ...],
    serve_args: list[str],
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        folder = Path(tmp)
        model = write_model(folder, seed)
        server = Server(model, folder / "serve.log", serve_args)
        try:
            served = {
                key: _served_vs_direct(server, model, rows, fmt, seconds, concurrencies, repeats)
                for key, rows, fmt in KINDS
            }
            saturation = served["npz_32"]["requests_per_s"]
            curve = [
                phase(
                    server,
                    {
                        "mode": "open",
                        "rows": 32,
                        "format": "npz",
                        "rate": f * saturation,
                        "seconds": seconds,
                        "workers": 64,
                        "seed": seed,
                    },
                )
                | {"offered_fraction_of_saturation": f}
                for f in fractions
            ]
        finally:
            server.stop()
    half = min(curve, key=lambda p: abs(p["offered_fraction_of_saturation"] - 0.5))
    summary = {
        "throughput_ratio": served["npz_32"]["ratio"],
        "throughput_ratio_256": served["npz_256"]["ratio"],
        "json_throughput_ratio": served["json_32"]["ratio"],
        "p99_s_at_half_saturation": half["p99_s"],
        "p50_s_at_half_saturation": half["p50_s"],
        "cpu_efficiency_ratio": {k: v["cpu_efficiency_ratio"] for k, v in served.items()},
        "merged_batch_rows_mean": {k: v["merged_batch_rows_mean"] for k, v in served.items()},
        "served": served,
        "saturation_requests_per_s": saturation,
        "latency_curve": curve,
        "loadgen_cpu_share": {k: v["loadgen_cpu_share"] for k, v in served.items()},
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "config": {
            "model": "default simulate task: fashion-mnist/cnn (1x28x28, 10 classes)",
            "seconds_per_phase": seconds,
            "concurrencies": concurrencies,
            "repeats": repeats,
            "serve_args": serve_args,
        },
    }
    summary["targets"] = {
        f"throughput_ratio >= {TARGET_RATIO}": summary["throughput_ratio"] >= TARGET_RATIO,
        f"throughput_ratio_256 >= {TARGET_RATIO}": summary["throughput_ratio_256"] >= TARGET_RATIO,
    }
    return summary


def _served_vs_direct(
    server: Server,
    model: Path,
    rows: int,
    fmt: str,
    seconds: float,
    concurrencies: list[int],
    repeats: int,
) -> dict[str, Any]:
    """Saturation (the best of `concurrencies`, closed loop), then `repeats` pairs of the
    direct baseline and the served rate at that concurrency, back to back, so a change in
    the machine's other load hits both sides of a pair alike; the median pair's ratio."""

    def spec(c: int) -> dict[str, Any]:
        warmup = min(1.0, seconds / 4)
        return {"mode": "closed", "rows": rows, "format": fmt, "concurrency": c} | {
            "seconds": seconds,
            "warmup": warmup,
        }

    tried = [phase(server, spec(c)) | {"concurrency": c} for c in concurrencies]
    best = max(tried, key=lambda r: r["rows_per_s"])["concurrency"]
    pairs = []
    for _ in range(repeats):
        direct = direct_best(model, rows, seconds)
        pairs.append((direct, phase(server, spec(best)) | {"concurrency": best}))
    ratios = [v["rows_per_s"] / d["rows_per_s"] for d, v in pairs]
    middle = sorted(range(len(pairs)), key=lambda i: ratios[i])[len(pairs) // 2]
    direct, served = pairs[middle]
    # Load-independent: rows per CPU-second of the server process against the direct
    # loop's (on a busy machine a multi-threaded server may simply get more CPU).
    per_cpu = served["rows_per_s"] / max(served["server_cpu_share"], 1e-9)
    return served | {
        "ratio": ratios[middle],
        "rows_per_server_cpu_s": per_cpu,
        "cpu_efficiency_ratio": per_cpu / direct["rows_per_cpu_s"],
        "ratios": ratios,
        "direct": direct,
        "by_concurrency": tried,
    }


def format_report(s: dict[str, Any]) -> str:
    lines = [
        f"fedveil bench serve: {s['config']['model']}; load before {s['machine']['load_before']} "
        f"on {s['machine']['cpus']} CPUs",
        f"{'request':<10}{'direct rows/s':>15}{'served rows/s':>15}{'ratio':>8}"
        f"{'merged rows':>13}{'loadgen CPU':>13}{'server CPU':>12}{'best C':>8}"
        f"{'rows/CPU-s ratio':>18}",
    ]
    for key, _, _ in KINDS:
        v = s["served"][key]
        d = v["direct"]["rows_per_s"]
        lines.append(
            f"{key:<10}{d:>15.0f}{v['rows_per_s']:>15.0f}{v['ratio']:>8.2f}"
            f"{v['merged_batch_rows_mean']:>13.1f}{v['loadgen_cpu_share']:>13.2f}"
            f"{v['server_cpu_share']:>12.2f}{v['concurrency']:>8}"
            f"{v['cpu_efficiency_ratio']:>18.2f}"
        )
    lines.append("latency, NPZ 32 images, open loop (Poisson):")
    lines.append(
        f"{'offered':>10}{'req/s':>9}{'achieved':>10}{'p50 ms':>9}{'p99 ms':>9}{'merged':>8}"
    )
    for p in s["latency_curve"]:
        lines.append(
            f"{p['offered_fraction_of_saturation']:>9.0%} {p['offered_rps']:>8.0f}"
            f"{p['achieved_rps']:>10.0f}{1000 * p['p50_s']:>9.1f}{1000 * p['p99_s']:>9.1f}"
            f"{p['merged_batch_rows_mean']:>8.1f}"
        )
    for target, ok in s["targets"].items():
        lines.append(f"target {target}: {'met' if ok else 'NOT met'}")
    return "\n".join(lines)


SERVE_SUMMARY = (
    "`fedveil bench serve`: `fedveil serve` on loopback (the default simulate task's CNN, "
    "random weights) against calling the model directly on batches of the request size: "
    "served rows/s for NPZ requests of 32 and 256 images and JSON of 32 (closed loop, the "
    "best of --concurrency), each measured --repeat times back to back with the direct "
    "rate (the median pair's ratio), the merged batch sizes from the server's /metrics, the load "
    "generator's CPU share (its own process), and p50/p99 latency at increasing offered "
    "rates (open loop, Poisson) up to and past saturation; --json prints one JSON object "
    "as the last line of stdout."
)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench serve`."""
    p.add_argument("--quick", action="store_true", help="short phases, few rates (a smoke test)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per load phase [3]")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="direct/served pairs per request kind, back to back; the median ratio [3]",
    )
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[2, 4, 8],
        metavar="C,C,...",
        help="closed-loop connections tried; the best is the saturated rate [2,4,8]",
    )
    p.add_argument("--max-batch", type=int, help="passed to fedveil serve [its default]")
    p.add_argument("--max-wait-ms", type=float, help="passed to fedveil serve [its default]")
    p.add_argument("--threads", type=int, help="passed to fedveil serve [its default]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_serve(args: argparse.Namespace) -> int:
    serve_args = []
    if args.max_batch is not None:
        serve_args += ["--max-batch", str(args.max_batch)]
    if args.max_wait_ms is not None:
        serve_args += ["--max-wait-ms", str(args.max_wait_ms)]
    if args.threads is not None:
        serve_args += ["--threads", str(args.threads)]
    if args.quick:
        seconds, concurrencies, fractions, repeats = 0.5, [4], QUICK_FRACTIONS, 1
    else:
        seconds, concurrencies = args.seconds, args.concurrency
        fractions, repeats = RATE_FRACTIONS, args.repeat
    summary = run_benchmark(
        seconds=seconds,
        concurrencies=concurrencies,
        fractions=fractions,
        serve_args=serve_args,
        repeats=repeats,
        seed=args.seed,
    )
    summary["quick"] = bool(args.quick)
    print_report(summary, format_report(summary), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench serve` and `python -m fedveil.benchmarks.bench_serve`; with
    --loadgen SPEC, the load generator's own process."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--loadgen"]:
        spec = json.loads(argv[1])
        result = closed_loop(spec) if spec["mode"] == "closed" else open_loop(spec)
        print(json.dumps(result))
        return 0
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_serve",
        description=SERVE_SUMMARY,
        add_arguments=add_serve_arguments,
        run=cmd_bench_serve,
    )


if __name__ == "__main__":
    sys.exit(main())
