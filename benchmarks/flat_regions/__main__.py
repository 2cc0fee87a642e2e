import sys

from benchmarks.flat_regions.command import main

sys.exit(main())
