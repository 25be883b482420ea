"""``python -m streaming --config FILE``: the job's entry point (spark-submit uses deploy/spark/kpmon_stream.py)."""

import sys

from streaming.job import main

sys.exit(main())
