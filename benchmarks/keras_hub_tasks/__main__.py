"""`python -m benchmarks.keras_hub_tasks`: see `benchmarks.keras_hub_tasks.command`."""

import sys

from benchmarks.keras_hub_tasks.command import main

sys.exit(main())
