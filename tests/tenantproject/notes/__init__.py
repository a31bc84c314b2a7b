"""A tenant app: each tenant's schema has its own notes table, written by a periodic task's body."""
