"""``python -m course_lib``: the same as the ``course`` command."""
import sys

from course_lib.cli import main

sys.exit(main())
