import sys

from soakspec.cli import entry

sys.exit(entry())
