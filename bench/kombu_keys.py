"""What a benchmark leaves in a shared Redis broker, taken away again: the keys that name its run, and its
members of kombu's shared sets (the exchanges' bindings, their deadlines, the unacked messages)."""

from __future__ import annotations

from typing import Any


def sweep(client: Any, *marks: str) -> int:
    """Delete the keys whose names carry one of ``marks``, and remove the members that carry one from
    kombu's shared binding sets, binding deadlines and unacked hash (the hash holds some only after a
    worker was killed). The shared keys themselves stay: other queues use them. Returns how many keys
    and members went."""
    removed = 0

    def ours(value: bytes | str) -> bool:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return any(mark in text for mark in marks)

    for mark in marks:
        for key in client.scan_iter(match=f"*{mark}*", count=500):
            removed += int(client.delete(key))
    for pattern in ("_kombu.binding.*", "_kombu.binding_permanent.*"):
        for key in client.scan_iter(match=pattern, count=500):
            if client.type(key) != b"set":
                continue
            members = [m for m in client.smembers(key) if ours(m)]
            if members:
                removed += int(client.srem(key, *members))
    if client.type("_kombu.binding_deadlines") == b"zset":
        members = [m for m, _ in client.zscan_iter("_kombu.binding_deadlines") if ours(m)]
        if members:
            removed += int(client.zrem("_kombu.binding_deadlines", *members))
    if client.type("unacked") == b"hash":
        tags = [tag for tag, value in client.hscan_iter("unacked") if ours(value)]
        if tags:
            removed += int(client.hdel("unacked", *tags))
            if client.type("unacked_index") == b"zset":
                client.zrem("unacked_index", *tags)
    return removed
