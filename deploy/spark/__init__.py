"""Running the streaming job on a Spark cluster: spark-submit plans, per-target defaults, packed venvs."""
