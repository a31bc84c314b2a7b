"""What ``bench/latency.py`` does in the broker's Redis: it reads back the notes that the beats and
the task bodies wrote there (``bench/latency_jobs.py``), empties the run's queue and notes
between phases, sweeps every key the run left behind, and times the beat's way of publishing a
round against one ``send_task`` per message.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from bench.common import BenchError
from bench.latency_figures import Sample, next_boundary, utc

PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport names priority lists "queue\x06\x16<n>"


@dataclasses.dataclass
class Notes:
    """What the beats and bodies wrote to Redis (``bench/latency_jobs.py``)."""

    pub: dict[str, tuple[float | None, float]]  # task id -> (due, signal time)
    wire: dict[str, float]
    start: dict[str, float]
    end: dict[str, float]

    @classmethod
    def read(cls, client: Any, key: str) -> Notes:
        def floats(name: str) -> dict[str, float]:
            return {k.decode(): float(v) for k, v in client.hgetall(f"{key}:{name}").items()}

        pub: dict[str, tuple[float | None, float]] = {}
        for field, value in client.hgetall(f"{key}:pub").items():
            due, _, moment = value.decode().partition(" ")
            pub[field.decode()] = (float(due) if due else None, float(moment))
        return cls(pub=pub, wire=floats("wire"), start=floats("start"), end=floats("end"))

    def published_at(self, task_id: str) -> float | None:
        if task_id in self.wire:
            return self.wire[task_id]
        noted = self.pub.get(task_id)
        return noted[1] if noted else None

    def dbs_samples(self, start: float, end: float) -> list[Sample]:
        return [Sample(slot=due, published=moment, started=self.start.get(task_id), ended=self.end.get(task_id))
                for task_id, (due, moment) in self.pub.items() if due is not None and start <= due < end]


def dbs_window_done(client: Any, key: str, end: float) -> bool:
    """Every publish due in the window has its body's end, and one past the window was sent."""
    notes = Notes.read(client, key)
    window = [task_id for task_id, (due, _moment) in notes.pub.items() if due is not None and due < end]
    past = any(due is not None and due >= end for due, _moment in notes.pub.values())
    return past and all(task_id in notes.end for task_id in window)


def publish_cost(client: Any, queue: str, messages: int = 2000, repeats: int = 3) -> dict[str, Any]:
    """Microseconds per message of the beat's way to publish a round (``publishing.RoundSender``)
    against ``app.send_task`` per message, as the beat did before: ``messages`` messages of as many
    task names (a round of distinct jobs) into kombu's publish batch, to the run's queue before any
    worker consumes it (emptied after each). Alternated ``repeats`` times; medians."""
    import statistics

    from bench.celery_app import app
    from cron_celery.beat import publishing
    from cron_celery.run import tasks

    slot = utc(next_boundary(time.time()))
    names = [f"bench.latency_cost_{i:06d}" for i in range(messages)]

    def by_send_task(producer: Any) -> None:
        for i, name in enumerate(names):
            tasks.publish(app, name, tasks.headers(i, slot, "BEAT"), task_id=uuid.uuid4().hex, producer=producer)

    def by_round(producer: Any) -> None:
        sender = publishing.RoundSender(app, producer)
        for i, name in enumerate(names):
            sender.send(name, tasks.headers(i, slot, "BEAT"), uuid.uuid4().hex)

    per_message: dict[str, list[float]] = {"send_task": [], "round": []}
    for _ in range(repeats + 1):  # the first pair warms up
        for way, send in (("send_task", by_send_task), ("round", by_round)):
            with app.producer_or_acquire() as producer, producer.batch(max_size=1000):
                started = time.perf_counter()
                send(producer)
            per_message[way].append((time.perf_counter() - started) / messages * 1e6)
            if client.llen(queue) != messages:
                raise BenchError(f"publish cost: {client.llen(queue)} messages in {queue}, {messages} sent")
            purge_queue(client, queue)
    send_task_us = statistics.median(per_message["send_task"][1:])
    round_us = statistics.median(per_message["round"][1:])
    return {"messages": messages, "repeats": repeats, "send_task_us": send_task_us, "round_us": round_us,
            "ratio": round_us / send_task_us}


def clear_notes(client: Any, key: str) -> None:
    for name in ("pub", "wire", "start", "end", "ready:dbs"):
        client.delete(f"{key}:{name}")


def purge_queue(client: Any, queue: str) -> None:
    client.delete(queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in (3, 6, 9)))


