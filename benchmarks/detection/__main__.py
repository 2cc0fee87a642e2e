"""`python -m benchmarks.detection`: see `benchmarks.detection.command`."""

import sys

from benchmarks.detection.command import main

sys.exit(main())
