"""spark-submit's main file for the kpmon streaming job.

spark-submit needs a file, not a module, as a Python application; this one hands its arguments
(``--config FILE``) to ``streaming.job.main``, which kpmon's installed environment provides.
"""

from __future__ import annotations

import sys

from streaming.job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
