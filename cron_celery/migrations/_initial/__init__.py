"""The SQL of the initial migration (``0001_initial``) that the models do not say: functions and triggers
by subsystem. It is part of that migration, so it never changes: a change is a new migration. Django
does not load this package as a migration (its name starts with an underscore)."""
