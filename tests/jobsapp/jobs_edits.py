"""Test jobs for edits (imported by tests/jobsapp/tasks.py)."""

from __future__ import annotations
