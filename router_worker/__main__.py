import sys

from router_worker.cli import main

sys.exit(main())
