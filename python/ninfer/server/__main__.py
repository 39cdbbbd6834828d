import sys

from ninfer.server.cli import main

sys.exit(main())
