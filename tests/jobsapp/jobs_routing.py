"""Test jobs for routing (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations
