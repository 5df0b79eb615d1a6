import sys

from soakspec.cli import main

sys.exit(main())
