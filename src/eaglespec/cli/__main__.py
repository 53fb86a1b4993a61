"""`python -m eaglespec.cli`: the `eaglespec` command."""

import sys

from .commands import main

sys.exit(main())
