"""`python -m benchmarks.suite`: see `benchmarks.suite.command`."""

import sys

from benchmarks.suite.command import main

sys.exit(main())
