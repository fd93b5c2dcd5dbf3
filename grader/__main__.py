"""``python -m grader``: see ``grader.cli``."""
import sys

from .cli import main

sys.exit(main())
