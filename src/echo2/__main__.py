"""`python -m echo2` runs the CLI."""

import signal
import sys

from echo2.cli import main

# The local launcher forks each role with SIGTERM and SIGINT blocked (so a stop request cannot
# land between the fork and its bookkeeping), and a child inherits that mask across exec: left
# blocked, a role ignores the launcher's SIGTERM, is SIGKILLed after the grace period and never
# writes its final metrics (worker_done, coordinator_final).
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
sys.exit(main())
