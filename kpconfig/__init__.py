"""What every kpmon package reads of its setting, below all of them: the config model (``model.py``),
where state and downloads live (``paths.py``), what /proc says of a process (``proc.py``), the Maven that fills the download cache (``mvn.py``) and
the version. It imports only the checks' settings the model is made of, so the tap, the streaming job,
the deployment, the DAGs and the CLI (``kpmon``, on top) all import it and it imports none of them.
"""

__version__ = "0.1.0"
