"""``python -m qkv`` is the ``qkv`` command."""

import sys

from qkv.cli import main

sys.exit(main())
