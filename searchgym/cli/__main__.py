import sys

from searchgym.cli import main

sys.exit(main())
