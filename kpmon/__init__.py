"""kafka-protocol-monitor's CLI (``kpmon``), ``kpmon run``'s orchestration and the real-client workload;
the config model it shares with the tap, the job and the DAGs lives in ``kpconfig``."""
