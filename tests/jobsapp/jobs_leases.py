"""Test jobs for leases (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations
