"""`python -m echo2` runs the CLI."""

import sys

from echo2.cli import main

sys.exit(main())
