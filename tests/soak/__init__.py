"""The nemesis soak: the whole system (PostgreSQL, a broker Redis, three lock Redis masters, two
beats, prefork workers with the reconciler) runs a set of jobs while faults are injected at random,
then everything is healed and a checker reads the whole history (``python -m tests.soak``;
``scripts/soak``). Also the Django app of the soak's own jobs (``tests.soak.tasks``).

No module here is named ``test_*``: pytest does not collect the soak.
"""
