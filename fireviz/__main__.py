import sys

from fireviz.cli import main

sys.exit(main())
