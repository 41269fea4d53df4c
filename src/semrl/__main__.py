import sys

from semrl.cli import main

sys.exit(main())
