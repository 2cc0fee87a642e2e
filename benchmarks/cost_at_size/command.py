"""The study's command line: `python -m benchmarks.cost_at_size [--models ...] [--sweep]`.

Measures each model in a fresh process (`measure`), then merges its row into
`cost_at_size.json` (rows of models not run are kept) and renders
`cost_at_size.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.cost_at_size import plan, report
from benchmarks.harness import ablations, provenance, xla_memory

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results")


def run_model(name: str, ablation: str = "") -> dict:
    """`measure` of model `name` in a fresh process (XLA programs dumped to a temporary folder)."""
    with tempfile.TemporaryDirectory() as dump, tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, KERAS_ALS_COST_DUMP=dump, TF_CPP_MIN_LOG_LEVEL="3")
        flags = xla_memory.dump_flags(dump, "one_step_on_data")
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
        path = os.path.join(out, "result.json")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "benchmarks.cost_at_size.measure", name, path, ablation],
            env=env,
            check=True,
        )
        with open(path) as f:
            result = json.load(f)
        result["seconds"] = time.perf_counter() - start
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost_at_size")
    parser.add_argument("--models", nargs="+", choices=[*plan.MODELS, *plan.SWEEP], default=[])
    parser.add_argument("--sweep", action="store_true", help="the depth sweep's DenseNets too")
    parser.add_argument(
        "--ablation",
        default="",
        choices=["", *ablations.NAMED],
        help="also time keras_als with this part left out (benchmarks/harness/ablations.py)",
    )
    parser.add_argument("--out", default=os.path.join(RESULTS, "cost_at_size"))
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: rewrite OUT.md from OUT.json"
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.out + ".json") as f:
            saved = json.load(f)
        with open(args.out + ".md", "w") as f:
            f.write(report.render(saved))
        return 0
    names = list(args.models) + (list(plan.SWEEP) if args.sweep else [])
    if not names:
        names = list(plan.MODELS) + list(plan.SWEEP)
    try:
        with open(args.out + ".json") as f:
            rows = {row["model"]: row for row in json.load(f)["rows"]}
    except FileNotFoundError:
        rows = {}
    for name in names:
        measured = provenance.code()  # the code as the model's process starts
        row = run_model(name, args.ablation)
        row["provenance"] = measured
        row["cpu"] = provenance.cpu()  # rows of one table may come from different machines
        row["command"] = f"python -m benchmarks.cost_at_size --models {name}" + (
            f" --ablation {args.ablation}" if args.ablation else ""
        )
        rows[name] = row
        print(report.line(row), flush=True)
        ordered = [rows[n] for n in [*plan.MODELS, *plan.SWEEP] if n in rows]
        command = "python -m benchmarks.cost_at_size " + " ".join(argv or sys.argv[1:])
        provenance.save(args.out, command.strip(), {"rows": ordered}, report.render)
    return 0
