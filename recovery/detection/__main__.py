import os
import sys

from recovery.detection.cli import main

try:
    sys.exit(main())
except BrokenPipeError:
    # The reader went away (e.g. `| head`): stop quietly, as other Unix tools do.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(1)
