"""``python -m mlcache``: the ``mlcache`` command, for an environment whose scripts are not on
PATH (a notebook's kernel, a Spark executor's interpreter)."""
import sys

from mlcache.cli import main

sys.exit(main())
