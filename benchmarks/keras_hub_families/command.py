"""The sweep's command line:
`python -m benchmarks.keras_hub_families [--families a,b] [--seeds 1,2]`.

Runs seed 1 of every family, then seed 2, in subprocesses (a crash or a hang
costs one family's seed), within the plan's time budget, then writes
`keras_hub_families.json` (every run) and `keras_hub_families.md` (the section
RESULTS.md takes in). `--render` measures nothing: it rewrites the markdown
from the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import provenance
from benchmarks.keras_hub_families import families, report

BUDGET_SECONDS = 45 * 60
FAMILY_SECONDS = 600


def child(names: list[str], seed: int, path: str, deadline: float) -> int:
    """Runs `names` on `seed` in this process, one line of `path` a family:
    `{"started": name}` before, `{"rows": [...]}` after; none starts after `deadline`."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from benchmarks.keras_hub_families import study

    for name in names:
        if time.time() > deadline:
            return 0
        with open(path, "a") as f:
            f.write(json.dumps({"started": name, "at": time.time()}) + "\n")
        rows = study.run_seed(name, seed)
        with open(path, "a") as f:
            f.write(json.dumps({"rows": rows}) + "\n")
        print(f"{name} seed {seed}: {_progress(rows)}", flush=True)
    return 0


def _lines(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _lost(name: str, seed: int, why: str) -> list[dict]:
    """Rows of a family's seed whose subprocess crashed or was stopped."""
    from benchmarks.keras_hub_families import study

    return [study._failed(name, m, seed, why) for m in study.METHODS]


def sweep(
    names: list[str], seeds: list[int], deadline: float, family_seconds: float = FAMILY_SECONDS
) -> tuple[list[dict], list[str]]:
    """Every family of `names` on each seed (seed-major), each in a subprocess
    stopped after `family_seconds`; returns the rows and the `family seed`
    pairs not started by `deadline`."""
    rows: list[dict] = []
    not_run: list[str] = []
    for seed in seeds:
        remaining = list(names)
        while remaining:
            if time.time() > deadline:
                not_run += [f"{n} (seed {seed})" for n in remaining]
                break
            handle, path = tempfile.mkstemp(suffix=".jsonl")
            os.close(handle)
            arguments = ["--child", ",".join(remaining), "--seeds", str(seed), "--status", path]
            arguments += ["--deadline", str(deadline)]
            process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.keras_hub_families", *arguments]
            )
            why = None
            while process.poll() is None:
                time.sleep(2)
                lines = _lines(path)
                if lines and "started" in lines[-1]:
                    if time.time() - lines[-1]["at"] > family_seconds:
                        process.kill()
                        process.wait()
                        why = f"timed out after {family_seconds:g} s"
            lines = _lines(path)
            os.remove(path)
            done = [line for line in lines if "rows" in line]
            for line in done:
                rows += line["rows"]
                name = line["rows"][0]["family"]
                remaining.remove(name)
            if lines and "started" in lines[-1]:
                name = lines[-1]["started"]
                why = why or f"subprocess exited with {process.returncode}"
                rows += _lost(name, seed, why)
                remaining.remove(name)
                print(f"{name} seed {seed}: {why}", flush=True)
            elif not done and process.returncode:  # it died before any family
                rows += [r for n in remaining for r in _lost(n, seed, why or "no start")]
                print(f"seed {seed}: the subprocess exited with {process.returncode}", flush=True)
                break
    return rows, not_run


def _progress(rows: list[dict]) -> str:
    return ", ".join(
        f"{r['method']} {r['outcome']:.4g}"
        + (f" ({r['skipped']} skipped)" if r.get("skipped") else "")
        + (" ERROR" if r.get("error") else "")
        for r in rows
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.keras_hub_families", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--families", help="comma-separated (default: all)")
    parser.add_argument("--seeds", default="1,2", help="comma-separated (default 1,2)")
    parser.add_argument("--out", help="output folder (default benchmarks/results)")
    parser.add_argument(
        "--family-seconds",
        type=float,
        default=FAMILY_SECONDS,
        help=f"time limit of one family's seed (default {FAMILY_SECONDS}: the plan's)",
    )
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: rewrite the .md from the .json"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--status", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.child:
        return child(args.child.split(","), seeds[0], args.status, args.deadline)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results")
    if args.render:
        with open(os.path.join(folder, "keras_hub_families.json")) as f:
            results = json.load(f)
        return _write(results, folder, with_json=False)
    names = args.families.split(",") if args.families else list(families.FAMILIES)
    unknown = set(names) - set(families.FAMILIES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; known: {', '.join(families.FAMILIES)}")
    start = time.perf_counter()
    rows, not_run = sweep(names, seeds, time.time() + BUDGET_SECONDS, args.family_seconds)
    argv = sys.argv[1:] if argv is None else argv
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    for row in rows:
        row["measured_by"] = date  # the run's date: its `kept` entry names it later
    results = {
        "study": "keras_hub_families",
        "date": date,
        "command": provenance.recorded_command("benchmarks.keras_hub_families", argv),
        "seconds": time.perf_counter() - start,
        "environment": provenance.environment(),
        "provenance": provenance.code(),
        "not_run": not_run,
        "runs": rows,
    }
    return _write(
        kept_from_earlier(results, os.path.join(folder, "keras_hub_families.json")), folder
    )


def kept_from_earlier(results: dict, path: str) -> dict:
    """`results`, with the runs of the file at `path` (if any) whose family and
    seed were not run now kept, and, in `"kept"`, each earlier command that
    measured some of them: its date, the keras_als code it measured and how
    many family-seed pairs of it are kept (each row's `measured_by` is its
    command's date); `not_run` keeps the earlier pairs that are still not run."""
    if not os.path.exists(path):
        return results
    with open(path) as f:
        earlier = json.load(f)
    now = {(r["family"], r["seed"]) for r in results["runs"]}
    others = [r for r in earlier["runs"] if (r["family"], r["seed"]) not in now]
    if not others:
        return results
    own = {"command": earlier["command"], "date": earlier["date"]}
    own["code"] = earlier.get("provenance")
    kept = []
    for source in [*earlier.get("kept", []), own]:
        pairs = {
            (r["family"], r["seed"])
            for r in others
            if r.get("measured_by", earlier["date"]) == source["date"]
        }
        if pairs:
            kept.append(
                {k: source.get(k) for k in ("command", "date", "code")} | {"runs": len(pairs)}
            )
    not_run = [n for n in earlier.get("not_run", []) if _pair(n) not in now]
    return results | {
        "runs": others + results["runs"],
        "kept": kept,
        "not_run": sorted(set(not_run) | set(results["not_run"]), key=_order),
    }


def _pair(not_run: str) -> tuple[str, int]:
    """`("bert", 2)` of `"bert (seed 2)"`."""
    name, seed = not_run.split(" (seed ")
    return name, int(seed.rstrip(")"))


def _order(not_run: str) -> tuple[int, int]:
    name, seed = _pair(not_run)
    return seed, list(families.FAMILIES).index(name) if name in families.FAMILIES else 0


def _write(results: dict, folder: str, with_json: bool = True) -> int:
    """Writes the results' JSON (unless not `with_json`) and markdown into `folder`."""
    os.makedirs(folder, exist_ok=True)
    text = report.markdown(results, list(families.FAMILIES))
    if with_json:
        with open(os.path.join(folder, "keras_hub_families.json"), "w") as f:
            json.dump(results, f, indent=1)
    with open(os.path.join(folder, "keras_hub_families.md"), "w") as f:
        f.write(text)
    print(text)
    return 0
