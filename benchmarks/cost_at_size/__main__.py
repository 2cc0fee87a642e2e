import sys

from benchmarks.cost_at_size.command import main

sys.exit(main())
