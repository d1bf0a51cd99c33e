import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Solved schedules are cached on disk by default; tests solve what they assert on, so the cache is off
# unless a test turns it on (with a directory of its own). Child processes inherit the setting.
os.environ.setdefault("CHECKMATE_SCHEDULE_CACHE", "0")
