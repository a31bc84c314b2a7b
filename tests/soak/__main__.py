"""``python -m tests.soak --minutes 2 --seed 1``: see ``tests.soak.run``."""

import sys

from tests.soak.run import main

sys.exit(main())
