import sys

from searchgym.app.cli import main

sys.exit(main())
