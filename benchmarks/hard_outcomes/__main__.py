"""`python -m benchmarks.hard_outcomes`: see `benchmarks.hard_outcomes.command`."""

import sys

from benchmarks.hard_outcomes.command import main

sys.exit(main())
