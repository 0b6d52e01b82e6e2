import sys

from ndp_ep.cli import main

sys.exit(main())
