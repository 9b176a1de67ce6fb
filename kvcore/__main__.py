"""``python -m kvcore`` runs the command line."""

import sys

from kvcore.cli import main

sys.exit(main())
