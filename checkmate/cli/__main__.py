"""``python -m checkmate.cli``: the same command as ``checkmate`` and ``python -m checkmate``."""

import sys

from checkmate.cli import main

if __name__ == "__main__":
    sys.exit(main())
