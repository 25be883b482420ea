"""Real-client traffic: a clean workload and catalogue violations made to happen for real."""
