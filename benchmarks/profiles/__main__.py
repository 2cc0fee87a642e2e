"""`python -m benchmarks.profiles NAME [ARGS]`: runs profile NAME's command with ARGS.

With no NAME (or an unknown one) it lists the profiles and their questions.
"""

import importlib
import sys

from benchmarks.profiles import PROFILES


def main(argv: list[str] | None = None) -> int:
    """Runs `benchmarks.profiles.NAME.main(ARGS)`; lists the profiles without a known NAME."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in PROFILES:
        print("usage: python -m benchmarks.profiles NAME [ARGS]   (NAME --help for its own)")
        for name, question in PROFILES.items():
            print(f"  {name:14s} {question}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    sys.argv[0] = f"python -m benchmarks.profiles {argv[0]}"  # argparse's prog
    importlib.import_module(f"benchmarks.profiles.{argv[0]}").main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
