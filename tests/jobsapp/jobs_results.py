"""Test jobs for results (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations
