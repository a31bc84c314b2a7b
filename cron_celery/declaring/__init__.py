"""Declaring jobs: the declarations and their checks (``registry``), a job's parameters (``params``), and
whether PostgreSQL can store a value as it is (``storable``). Beneath everything but the settings, enums,
exceptions, models and schedules at the top: a declaration never reaches the ORM."""
