"""python -m rcp11.server [redis.conf] [--directive value ...]"""

import sys

from rcp11.server.startup import main

sys.exit(main())
