"""`python -m benchmarks.gpu_roofline plan|compare`: see `benchmarks/README.md`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.gpu_roofline.cases import compare, plan


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_roofline")
    commands = parser.add_subparsers(dest="command", required=True)
    plan_command = commands.add_parser("plan", help="print the cases to measure (JSON)")
    plan_command.add_argument("--gpu", default="H200-141GB", help="GPU type of the steady states")
    compare_command = commands.add_parser("compare", help="the planner beside a measurement")
    compare_command.add_argument("results", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "plan":
        print(json.dumps(plan(args.gpu), indent=1))
    else:
        sys.stdout.write(compare([json.loads(path.read_text()) for path in args.results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
