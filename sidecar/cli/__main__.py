"""`python -m sidecar.cli`: the `sidecar` command (client configs written by `sidecar` use it)."""

import sys

from sidecar.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
