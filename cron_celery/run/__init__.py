"""One run: the task a worker receives (``tasks``), the path of a run (``runs``), every outcome's
announcement (``outcomes``, ``events``), retries, leases, locks, shutdown and the worker's parent; and
what sends runs for a person (a backfill, a resume). Never imports the beat, the reconciler, the alerts
or the web: a listener is reached through ``events``."""
