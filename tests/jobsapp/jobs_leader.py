"""Test jobs for leader (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations
