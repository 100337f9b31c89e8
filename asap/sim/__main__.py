"""`python -m asap.sim ...`: the same commands as `asap sim ...` (they live in asap/studies/__main__.py)."""
import sys

from asap.studies.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
