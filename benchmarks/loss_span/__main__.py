"""`python -m benchmarks.loss_span`: see `benchmarks.loss_span.command`."""

import sys

from benchmarks.loss_span.command import main

sys.exit(main())
