import sys

from forktools.cli import main

sys.exit(main())
