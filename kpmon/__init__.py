"""kafka-protocol-monitor: the CLI and the configuration model shared by the tap, the job and the DAGs."""

__version__ = "0.1.0"
