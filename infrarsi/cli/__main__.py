"""``python -m infrarsi.cli``: the ``infrarsi`` command."""

import sys

from infrarsi.cli.main import main

sys.exit(main())
