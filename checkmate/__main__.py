import sys

from checkmate.cli import main

sys.exit(main())
