"""Periodic tasks tracked as jobs, with no change to their code (``TRACK_PERIODIC_TASKS``): which ones
(``selection``), their job rows kept in line (``rows``), and the worker's side (``worker``)."""
