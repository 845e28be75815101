"""``python -m loaderkit.cli``: the ``loaderkit`` command where it is not installed."""

import sys

from loaderkit.cli.commands import main

sys.exit(main())
