"""`python -m sidecar`: the `sidecar` command."""

import sys

from sidecar.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
