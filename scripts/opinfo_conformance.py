#!/usr/bin/env python3
"""Runs PyTorch's OpInfo database through the torch.compile backend (backend="dvm") against
eager and writes one JSON record per (op, dtype) case: status (dvm, fallback, wrong, exception,
crash, timeout, no_samples, skipped), reason, the backend's counters (DVM partitions and nodes,
nodes left to PyTorch, fallbacks), the fallback reasons it logged, per-sample outcomes and
seconds. What a case runs and how it is judged: python/tests/opinfo_harness.py.

    python3 scripts/opinfo_conformance.py                      # all cases -> bench_results/opinfo.json
    python3 scripts/opinfo_conformance.py --ops softmax,sum    # some ops (OpInfo names, exact)
    python3 scripts/opinfo_conformance.py --update-expected    # rewrite python/tests/opinfo_expected.json

Cases run in worker subprocesses, a chunk at a time; a worker that dies (a crash in DVM) or a
case that runs past --timeout is recorded as such and the chunk goes on in a new worker. The
summary compares the run with the expected lists; the exit status is 1 when they differ
(unless --update-expected), as python/tests/test_opinfo.py would fail with DVM_OPINFO=full.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import queue
import selectors
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

MARK = "@@opinfo "  # a worker's result lines; anything else on its stdout is torch chatter


def worker(threads: int, samples: int) -> None:
    """Reads cases (JSON lines "[op, dtype]") from stdin, writes MARK + a record per case."""
    import warnings

    import torch

    import opinfo_harness as h

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    ops = h.op_by_name()
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name, dtype = json.loads(line)
        print(MARK + json.dumps({"start": [name, dtype]}), flush=True)
        try:
            rec = h.run_case(ops[name], name, dtype, samples)
        except Exception as e:  # noqa: BLE001  (the harness itself failed: still a record)
            rec = {"op": name, "dtype": dtype, "status": "exception",
                   "reason": f"harness: {h._one_line(e)}"}
        print(MARK + json.dumps(rec), flush=True)


class Worker:
    """One worker process: send a case, wait for its record with a timeout."""

    def __init__(self, args):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads",
               str(args.threads), "--samples", str(args.samples)]
        if args.nice:
            cmd = ["nice", "-n", str(args.nice)] + cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        self.stderr_tail = collections.deque(maxlen=30)
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buf = ""

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_tail.append(line.rstrip())

    def read(self, timeout):
        """The next MARK record; None on timeout or end of output."""
        deadline = time.monotonic() + timeout
        while True:
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                if line.startswith(MARK):
                    return json.loads(line[len(MARK):])
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16).decode(errors="replace")
            if not chunk:
                return None
            self.buf += chunk

    def send(self, case):
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_chunk(cases, args, out: list, lock, progress):
    """Runs `cases` in workers, a new one after each crash or timeout."""
    pending = list(cases)
    while pending:
        w = Worker(args)
        if w.read(300) is None:
            raise SystemExit("opinfo: a worker did not start:\n" + "\n".join(w.stderr_tail))
        while pending:
            case = pending[0]
            try:
                w.send(case)
            except BrokenPipeError:
                break
            start = w.read(60)
            rec = w.read(args.timeout) if start is not None else None
            if rec is None:
                alive = w.proc.poll() is None
                w.kill()
                status = "timeout" if alive else "crash"
                why = (f"no result after {args.timeout:g} s" if alive else
                       f"the process died (exit status {w.proc.returncode})")
                tail = [line for line in w.stderr_tail if line.strip()][-3:]
                rec = {"op": case[0], "dtype": case[1], "status": status,
                       "reason": why + (": " + " | ".join(tail) if tail and not alive else "")}
            pending.pop(0)
            with lock:
                out.append(rec)
                progress(rec)
            if rec["status"] in ("timeout", "crash"):
                break
        w.kill()


def select_cases(ops, args):
    import opinfo_harness as h

    cases = h.all_cases(ops)
    if args.ops:
        wanted = set(args.ops.split(","))
        unknown = wanted - set(ops)
        if unknown:
            raise SystemExit(f"opinfo: unknown OpInfo ops {sorted(unknown)}")
        cases = [c for c in cases if c[0] in wanted]
    if args.dtypes:
        cases = [c for c in cases if c[1] in args.dtypes.split(",")]
    return cases


def summarize(results, expected):
    import opinfo_harness as h

    table = collections.defaultdict(collections.Counter)
    for r in results:
        table[r["dtype"]][r["status"]] += 1
    statuses = ["dvm", "fallback", "wrong", "exception", "crash", "timeout", "no_samples",
                "skipped"]
    lines = [f"{'dtype':6}" + "".join(f"{s:>11}" for s in statuses)]
    total = collections.Counter()
    for dt in h.DTYPES:
        if dt in table:
            total.update(table[dt])
            lines.append(f"{dt:6}" + "".join(f"{table[dt][s]:>11}" for s in statuses))
    lines.append(f"{'all':6}" + "".join(f"{total[s]:>11}" for s in statuses))
    changes = [c for c in (h.check_against_expected(r, expected) for r in results
                           if r["status"] != "skipped") if c]
    return {dt: dict(c) for dt, c in table.items()} | {"all": dict(total)}, lines, changes


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def update_expected(results, cases_run, ops):
    """Rewrites the expected lists from this run; cases not run keep their old entries."""
    import opinfo_harness as h

    old = h.load_expected() if os.path.exists(h.EXPECTED_PATH) else {}
    run = set(map(tuple, cases_run))
    merged = [r for r in results if r["status"] not in ("skipped", "no_samples")]
    for name, dtype in h.all_cases(ops):
        if (name, dtype) in run:
            continue
        status, reason = h.expected_status(old, name, dtype)
        merged.append({"op": name, "dtype": dtype, "status": status, "reason": reason})
    new = h.expected_from_results(merged, old)
    h.dump_expected(new)
    return new


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench_results", "opinfo.json"))
    ap.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--dtypes", help="comma-separated among f32,f16,bf16,i32,i64,bool")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at once (1)")
    ap.add_argument("--threads", type=int, default=1, help="torch/DVM threads per worker (1)")
    ap.add_argument("--samples", type=int, default=None,
                    help="samples per case (default: the harness's SAMPLES_PER_CASE; the "
                         "expected lists are only comparable at that count)")
    ap.add_argument("--chunk", type=int, default=50, help="cases per worker process (50)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per case (180)")
    ap.add_argument("--nice", type=int, default=0, help="run workers under nice -n N")
    ap.add_argument("--update-expected", action="store_true",
                    help="rewrite python/tests/opinfo_expected.json from this run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import opinfo_harness as h

    if args.samples is None:
        args.samples = h.SAMPLES_PER_CASE
    if args.worker:
        return worker(args.threads, args.samples)
    if args.update_expected and args.samples != h.SAMPLES_PER_CASE:
        raise SystemExit("opinfo: --update-expected needs the harness's sample count")

    ops = h.op_by_name()
    cases = select_cases(ops, args)
    skipped = [c for c in cases if c[0] in h.SKIPS]
    todo = [c for c in cases if c[0] not in h.SKIPS]
    results = [{"op": n, "dtype": d, "status": "skipped", "reason": h.SKIPS[n]}
               for n, d in skipped]
    lock = threading.Lock()
    t0 = time.monotonic()
    done = [0]

    def progress(rec):
        done[0] += 1
        if rec["status"] not in ("dvm", "fallback", "no_samples") or done[0] % 100 == 0:
            print(f"[{done[0]}/{len(todo)} {time.monotonic() - t0:.0f}s] {rec['op']} "
                  f"{rec['dtype']}: {rec['status']} {rec.get('reason', '')[:160]}", flush=True)

    chunks = queue.Queue()
    for i in range(0, len(todo), args.chunk):
        chunks.put(todo[i: i + args.chunk])

    def job():
        while True:
            try:
                chunk = chunks.get_nowait()
            except queue.Empty:
                return
            run_chunk(chunk, args, results, lock, progress)

    threads = [threading.Thread(target=job) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    results.sort(key=lambda r: (r["op"], list(h.DTYPES).index(r["dtype"])))

    expected = h.load_expected() if os.path.exists(h.EXPECTED_PATH) else {}
    summary, lines, changes = summarize(results, expected)
    import torch

    doc = {
        "meta": {"what": "OpInfo samples through torch.compile(backend='dvm', dynamic=True) vs "
                         "eager (python/tests/opinfo_harness.py)",
                 "git": git_head(), "torch": torch.__version__,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"),
                 "samples_per_case": args.samples, "threads": args.threads,
                 "jobs": args.jobs, "wall_s": round(wall, 1),
                 "ops": args.ops, "dtypes": args.dtypes},
        "summary": summary,
        "changes_vs_expected": changes,
        "cases": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print("\n".join(lines))
    print(f"{len(results)} cases in {wall:.0f} s -> {args.out}")
    for r in results:
        if r["status"] in ("wrong", "exception", "crash", "timeout"):
            print(f"  {r['status']:9} {r['op']} {r['dtype']}: {r.get('reason', '')[:200]}")
    if args.update_expected:
        update_expected(results, cases, ops)
        print(f"rewrote {os.path.relpath(h.EXPECTED_PATH, ROOT)}")
        return 0
    if changes:
        print(f"{len(changes)} case(s) differ from python/tests/opinfo_expected.json:")
        print("\n".join(f"  {c}" for c in changes))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
