import sys

from benchmarks.solo import main

sys.exit(main())
