"""``python -m checkmate.cli``: the same command as ``checkmate`` and ``python -m checkmate``."""

import sys

from checkmate.cli import main

sys.exit(main())
