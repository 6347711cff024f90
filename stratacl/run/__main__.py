"""`python -m stratacl.run`."""

import sys

from stratacl.run.cli import cli

cli(sys.argv[1:])
