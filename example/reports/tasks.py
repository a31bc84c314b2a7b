"""Sample jobs, found by autodiscovery of each installed app's ``tasks`` module.

Run one with ``python manage.py run_cron_task daily-report 2026-11-29`` (in this
process) or send it to the workers with ``--enqueue``; ``list_cron_tasks`` lists them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random

from cron_celery import ExecutionPattern, Run, TrackedTask, cron_task, register_task
from cron_celery.models import CronExecution, Status
from cron_celery.schedules import at, daily, every


@cron_task(name="daily-report", code="R001", pattern="standard", timezone="Europe/Amsterdam",
           schedule=daily(at(6).am()))
def daily_report(run: Run) -> dict[str, object]:
    """Builds the day's sales report (once per day: a second call for the day is skipped)."""
    rng = random.Random(run.execution_date.toordinal())  # the same figures for the same day
    orders = rng.randint(80, 160)
    revenue = round(orders * rng.uniform(20, 60), 2)
    run.logger.info("report for %s: %s orders", run.execution_date, orders)
    return {
        "error": False,
        "message": f"Sales report {run.execution_date}: {orders} orders, EUR {revenue:,.2f}",
        "orders": orders,
        "revenue": revenue,
    }


@register_task("sync-partner-api", "S001", execution_pattern=ExecutionPattern.RERUN_ON_FAILURE,
               timezone="UTC", schedule=every(minutes=30))
class SyncPartnerAPI(TrackedTask):
    """Pulls the day's orders from the partner's API, every half hour.

    The partner here is simulated: its API answers 503 to the first call of each day (the
    run fails and the failure alert goes out) and works once that failure is on record
    (the next run succeeds and the recovery alert goes out). The state is the execution
    history in the database (worker processes share nothing else).
    """

    def execute(self, date: dt.date) -> dict[str, object]:
        already_failed = CronExecution.objects.filter(
            task_name="sync-partner-api", execution_date=date, status=Status.FAILED
        ).exists()
        if not already_failed:
            return {
                "error": True,
                "message": "Partner API answered 503 Service Unavailable",
                "error_code": "HTTP_503",
            }
        return {"error": False, "message": f"Synced 17 partner orders for {date}"}


async def _fetch_rate(currency: str) -> tuple[str, float]:
    await asyncio.sleep(0.05)  # stands in for an HTTP call
    return currency, round(random.uniform(0.5, 1.5), 4)


@cron_task(name="refresh-exchange-rates", code="X001", pattern="rerun_on_failure", timezone="UTC")
async def refresh_exchange_rates(run: Run) -> str:
    """Fetches exchange rates concurrently (an ``async def`` job)."""
    rates = dict(await asyncio.gather(*(_fetch_rate(c) for c in ("USD", "GBP", "JPY", "CHF"))))
    return f"Fetched {len(rates)} exchange rates concurrently"


@cron_task(name="health-ping", code="H001", pattern="always", overlap="allow", timezone="UTC")
def health_ping(run: Run) -> str:
    """A fast job that runs on every call (pattern "always"); runs may overlap."""
    return f"pong (run #{run.run_number}, attempt {run.attempt})"


@cron_task(name="import-partner-feed", code="S002", pattern="rerun_on_failure", timezone="UTC",
           schedule=every(minutes=15), max_retries=3, retry_backoff=2, retry_on=(ConnectionError,))
def import_partner_feed(run: Run) -> str:
    """Imports the partner's order feed. On the workers its first attempt of every slot times
    out on the network (simulated) and the retry, two seconds later, gets through; alerts go
    to the channels in NOTIFICATIONS (Slack when SLACK_WEBHOOK_URL is set) only if every
    attempt fails. Run in-process by run_cron_task (no retries there) it succeeds at once."""
    if run.attempt == 1 and run.trigger != "MANUAL":
        raise ConnectionError("partner feed: connection timed out")
    return f"Imported the partner feed for {run.slot:%H:%M} on attempt {run.attempt}"


@cron_task(name="nightly-batch", code="B001", timezone="Europe/Amsterdam", schedule=daily(at(1).am()),
           soft_time_limit=3300, time_limit=3600, max_retries=1)
def nightly_batch(run: Run) -> str:
    """A long batch in chunks: it checks between chunks, so a worker shutdown (SIGTERM) stops
    it cleanly and the retry picks it up; the soft limit (55 min) comes before the hard one."""
    done = 0
    for _chunk in range(20):
        run.check()  # raises Interrupted on shutdown, LeaseLost if another worker took over
        done += 500
    return f"Re-indexed {done} documents"


@cron_task(name="cache-warmer", code="C010", pattern="always", overlap="skip", timezone="UTC",
           schedule=every(seconds=10))
def cache_warmer(run: Run) -> str:
    """Every ten seconds; never two at once (overlap "skip")."""
    return "warmed 12 cache keys"


@cron_task(name="extract-orders", code="E010", timezone="UTC", schedule=every(seconds=20), jitter=5)
def extract_orders(run: Run) -> str:
    """Every 20 seconds, sent a fixed few seconds after the slot (``jitter=5``: the offset comes
    from the code, so it is the same on every beat and after every deploy)."""
    return f"Extracted 42 orders for the slot {run.slot:%H:%M:%S}"


@cron_task(name="load-orders", code="L010", timezone="UTC", after=["extract-orders"])
def load_orders(run: Run) -> str:
    """No schedule of its own: each slot runs once extract-orders succeeded in it (``after=``)."""
    return f"Loaded the orders extracted for {run.slot:%H:%M:%S}"
