"""Celery baseline for Idem's benchmarks: grant-credits behind a Redis guard.

The task does what Idem's grant-credits plugin does (upsert a user's balance
into the kv table), made idempotent the usual Celery way: a claim-then-confirm
guard in Redis. `SET guard:<key> running NX EX 30` claims the key; a key
already `done` is a duplicate and is skipped; a key still `running` elsewhere
is retried later. After the upsert the guard is confirmed as `done` for a week.
"""

import json
import os
import time
import warnings

import psycopg
import redis
from celery import Celery
from celery.exceptions import SecurityWarning

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")

# Counter of completed tasks, polled by the benchmark driver.
DONE_COUNTER = "bench:celery:done"

RUNNING_TTL = 30  # seconds: a crashed claim frees the key this soon
DONE_TTL = 604800  # seconds: duplicates are recognised for a week

UPSERT = (
    "INSERT INTO bench_celery.kv (collection, key, value, updated_at) "
    "VALUES ('credits', %s, %s, %s) "
    "ON CONFLICT (collection, key) DO UPDATE "
    "SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at"
)

app = Celery("idem_bench", broker=REDIS_URL)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)

# Benchmark machines run everything as root; the worker need not say so.
warnings.filterwarnings("ignore", category=SecurityWarning)

guards = redis.Redis.from_url(REDIS_URL)

# One Postgres connection per worker process, opened on first use (after the
# prefork pool has forked, so no connection is shared between processes).
_pg = None


def pg():
    global _pg
    if _pg is None or _pg.closed:
        _pg = psycopg.connect(PG_URL, autocommit=True)
    return _pg


@app.task(bind=True, max_retries=None)
def grant_credits(self, key, user, balance):
    guard = f"guard:{key}"
    if not guards.set(guard, "running", nx=True, ex=RUNNING_TTL):
        if guards.get(guard) == b"done":
            return  # duplicate: already applied
        # Claimed by another delivery still running (or one that died, until
        # its claim expires): try again shortly.
        raise self.retry(countdown=1)
    value = json.dumps(balance).encode()
    pg().execute(UPSERT, (user, value, int(time.time() * 1000)))
    # Confirm, and count the task for the driver in the same round trip.
    guards.pipeline(transaction=False).set(guard, "done", ex=DONE_TTL).incr(
        DONE_COUNTER
    ).execute()
