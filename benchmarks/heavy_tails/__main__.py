"""`python -m benchmarks.heavy_tails`: see `benchmarks.heavy_tails.command`."""

import sys

from benchmarks.heavy_tails.command import main

sys.exit(main())
