"""``python -m headrace`` is the ``headrace`` command line."""

import sys

from headrace._cli.main import main

sys.exit(main())
