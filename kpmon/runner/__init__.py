"""``kpmon run``: the whole monitor in one command (local stack, tap, streaming job, demo, live report).

- ``plan``: the config the tap and the streaming job are started with (pure).
- ``children``: subprocesses in their own process groups, stopped in order, never orphaned.
- ``demo``: real clients making a clean workload and catalogue violations happen through the tap.
- ``progress``: the streaming job's terminal lines turned into live figures (pure).
- ``reporting``: the HTML report, written periodically from the tap topic and the job's batch results.
- ``orchestrator``: starts and stops all of it.
"""
