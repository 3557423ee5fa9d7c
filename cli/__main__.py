"""``python -m cli``: the same as the ``mmlinks`` script."""

import sys

from cli.main import main

sys.exit(main())
