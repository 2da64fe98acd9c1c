"""``python -m mmencode``: the ``mmencode`` command."""

import sys

from mmencode.app.cli import main

sys.exit(main())
