"""Helper for bench/celery/run: checks, resets, publishes, waits, verifies.

Usage: python driver.py check | reset | publish N | wait N T0_NS PID | verify N
       | idem-config C PLUGIN_DIR | wait-idem N T0_NS PID | verify-idem N
"""

import json
import os
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis

from tasks import DONE_COUNTER, PG_URL, REDIS_URL, app, grant_credits

USERS = 1000

# Idem's namespace when it consumes the tasks (--idem): its claims in Redis,
# its data in this Postgres schema, its unacked hash and delayed set.
IDEM_NS = "bench_celery_idem"


def fail(msg):
    print(f"celery bench: {msg}", file=sys.stderr)
    sys.exit(1)


def rdb():
    return redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)


def check():
    try:
        rdb().ping()
    except redis.RedisError as e:
        fail(f"Redis does not answer at {REDIS_URL}: {e}")
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as e:
        fail(f"Postgres does not answer at {PG_URL}: {e}")


def reset():
    """Recreate the table; delete only this benchmark's keys and queue."""
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS bench_celery CASCADE")
        c.execute(f"DROP SCHEMA IF EXISTS {IDEM_NS} CASCADE")
        c.execute("CREATE SCHEMA bench_celery")
        c.execute(
            "CREATE TABLE bench_celery.kv ("
            " collection TEXT NOT NULL, key TEXT NOT NULL, value BYTEA NOT NULL,"
            " updated_at BIGINT NOT NULL, PRIMARY KEY (collection, key))"
        )
    r = rdb()
    # The default queue (and its priority sub-queues), kombu's bookkeeping for
    # unacknowledged messages and bindings, the guards and the counter.
    keys = ["celery", "unacked", "unacked_index", "unacked_mutex", DONE_COUNTER]
    for pattern in ("celery\x06\x16*", "_kombu.binding.*", "guard:*", f"{IDEM_NS}:*"):
        keys.extend(r.scan_iter(match=pattern, count=1000))
    for i in range(0, len(keys), 1000):
        r.delete(*keys[i : i + 1000])


def publish(n):
    # Producer.batch() sends the LPUSHes through a Redis pipeline.
    with app.producer_or_acquire() as producer, producer.batch():
        for i in range(n):
            grant_credits.apply_async(
                (f"msg-{i}", f"user-{i % USERS}", i), producer=producer
            )
    queued = rdb().llen("celery")
    if queued != n:
        fail(f"published {n} tasks but the queue holds {queued}")


def poll_done(n, done_count, worker):
    """Print "ready" once connected, then read the worker's start time (ns)
    and PID from stdin: so the poller's own start-up is over before the
    worker starts, and counts in neither figure. Then print seconds from
    that start until done_count() reaches N, and until the first task was
    done (the worker's start-up). Fails after 60 s without progress, or if
    the worker PID exits."""
    done_count()
    print("ready", flush=True)
    t0_ns, pid = map(int, sys.stdin.readline().split())
    first = None
    last, last_change = 0, time.monotonic()
    while True:
        done = done_count()
        now = (time.time_ns() - t0_ns) / 1e9
        if done and first is None:
            first = now
        if done >= n:
            print(f"{now:.3f} {first:.3f}")
            return
        if done != last:
            last, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > 60:
            fail(f"no progress for 60 s ({done}/{n} tasks done)")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            fail(f"{worker} exited with {done}/{n} tasks done")
        time.sleep(0.02)


def wait(n):
    """Until the Celery tasks' counter reaches N."""
    r = rdb()
    poll_done(n, lambda: int(r.get(DONE_COUNTER) or 0), "the worker")


def wrong_balances(c, table):
    """Rows of `table` and how many hold another user's balance."""
    return c.execute(
        f"SELECT count(*), count(*) FILTER (WHERE"
        f" convert_from(value, 'UTF8')::bigint % 1000"
        f" <> substr(key, 6)::bigint) FROM {table} WHERE collection = 'credits'"
    ).fetchone()


def verify(n):
    r = rdb()
    done = int(r.get(DONE_COUNTER) or 0)
    guard_keys = list(r.scan_iter(match="guard:*", count=1000))
    done_guards = sum(
        v == b"done"
        for i in range(0, len(guard_keys), 1000)
        for v in r.mget(guard_keys[i : i + 1000])
    )
    left = r.llen("celery") + r.hlen("unacked")
    with psycopg.connect(PG_URL) as c:
        rows, bad = wrong_balances(c, "bench_celery.kv")
    want_rows = min(n, USERS)
    if (done, done_guards, rows, bad, left) != (n, n, want_rows, 0, 0):
        fail(
            f"verification failed: counter {done}/{n}, done guards "
            f"{done_guards}/{n}, rows {rows}/{want_rows}, wrong balances {bad}, "
            f"messages left in Redis {left}"
        )


def idem_config(concurrency, plugins):
    """An Idem config consuming the benchmark's Celery queue: the Rust port
    of grant_credits, keyed like the guard (the first argument), claims in
    the benchmark's Redis and data in its Postgres. Results are off, as
    the Celery tasks ignore theirs."""
    pg = urlsplit(PG_URL)
    pg_url = urlunsplit(("postgres",) + tuple(pg)[1:])
    print(f"""namespace = "{IDEM_NS}"

[broker]
kind = "celery"
url = {json.dumps(REDIS_URL)}
queues = ["celery"]
result_backend = ""

[claims]
kind = "redis"
url = {json.dumps(REDIS_URL)}

[data]
kind = "postgres"
url = {json.dumps(pg_url)}

[worker]
concurrency = {concurrency}

[plugins.grant-credits]
path = {json.dumps(os.path.join(plugins, "celery_grant_credits.wasm"))}
celery_task = "tasks.grant_credits"
key_pointer = "/args/0"
collections = ["credits"]
""")


def idem_left(r):
    return r.llen("celery") + r.hlen(f"{IDEM_NS}:celery:unacked") + r.zcard(f"{IDEM_NS}:celery:delayed")


def wait_idem(n):
    """As wait, for Idem: until no task is queued or unacked."""
    r = rdb()
    poll_done(n, lambda: n - idem_left(r), "idem run")


def verify_idem(n):
    r = rdb()
    left, dead = idem_left(r), r.llen(f"{IDEM_NS}:dead:ids")
    with psycopg.connect(PG_URL) as c:
        rows, bad = wrong_balances(c, f"{IDEM_NS}.kv")
    want_rows = min(n, USERS)
    if (rows, bad, left, dead) != (want_rows, 0, 0, 0):
        fail(
            f"verification failed: rows {rows}/{want_rows}, wrong balances {bad}, "
            f"tasks left in Redis {left}, dead letters {dead}"
        )


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "idem-config":
        idem_config(int(args[0]), args[1])
        return
    {"check": check, "reset": reset, "publish": publish, "wait": wait,
     "verify": verify, "wait-idem": wait_idem, "verify-idem": verify_idem}[cmd](*map(int, args))


if __name__ == "__main__":
    main()
