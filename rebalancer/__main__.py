"""`python -m rebalancer`: the command line, as the container image runs it (it has no console scripts).

Owns only the hand-off to `rebalancer.cli.main` and its exit code; must not hold any logic of its own.
"""

import sys

from rebalancer.cli import main

if __name__ == "__main__":
    sys.exit(main())
