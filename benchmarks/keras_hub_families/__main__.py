import sys

from benchmarks.keras_hub_families.command import main

sys.exit(main())
