import sys

from archsearch.cli import main

sys.exit(main())
