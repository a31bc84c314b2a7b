"""What ``faketime`` leaves in /dev/shm for a process killed under it: its semaphore and shared memory,
named by its pid. A new process given that pid again fails with "sem_open: File exists", so the tests
and the soak clear the leftovers of processes that are gone before they start anything under it."""

from __future__ import annotations

from pathlib import Path


def clear_stale() -> int:
    """Remove what ``faketime`` left in /dev/shm for processes that are gone (a process killed under it
    keeps its semaphore and shared memory, named by its pid): a new process given that pid again would
    fail with "sem_open: File exists". Returns how many it removed."""
    removed = 0
    for leftover in [*Path("/dev/shm").glob("sem.faketime_sem_*"), *Path("/dev/shm").glob("faketime_shm_*")]:
        pid = leftover.name.rpartition("_")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed
