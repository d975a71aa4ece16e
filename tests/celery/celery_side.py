"""The Celery side of Idem's Celery interop tests: a producer that sends
tasks the way a web app does, a client that reads their results the way
`AsyncResult(id).get()` does, and a task of its own served by a real Celery
worker (`celery -A celery_side worker`).

Settings come from the environment: CELERY_BROKER (a redis:// or amqp://
URL), CELERY_BACKEND (the Redis result backend; the broker by default),
IDEM_QUEUE (the queue Idem consumes) and CELERY_QUEUE (the queue the Celery
worker consumes). Every command prints one JSON line.
"""

import json
import os
import sys
import uuid
from datetime import datetime, timedelta, timezone

import redis
from celery import Celery, chain
from celery.result import AsyncResult

BROKER = os.environ["CELERY_BROKER"]
BACKEND = os.environ.get("CELERY_BACKEND", BROKER)
IDEM_QUEUE = os.environ["IDEM_QUEUE"]
CELERY_QUEUE = os.environ.get("CELERY_QUEUE", "celery")
# Task ids start with it, so tests sharing a Redis never read each other's
# results.
PREFIX = os.environ["TASK_PREFIX"]

app = Celery("celery_side", broker=BROKER, backend=BACKEND)
app.conf.update(task_default_queue=CELERY_QUEUE, broker_connection_retry_on_startup=True, result_expires=600)


@app.task(name="billing.grant_credits")
def grant_credits(key, user, balance):
    """Served by Idem (the celery-grant-credits plugin), never here."""
    raise RuntimeError("billing.grant_credits runs on Idem")


@app.task(name="mixed.add")
def add(x, y):
    """Served by the Celery worker."""
    return x + y


def send(n):
    """Tasks 0..n: half through send_task, half through apply_async; every
    tenth sent twice with the same task id; every seventh with a countdown;
    one that expired before it was sent."""
    sent = 0
    for i in range(n):
        tid = f"{PREFIX}-t-{i}"
        countdown = 1 if i % 7 == 3 else None
        copies = 2 if i % 10 == 5 else 1
        for _ in range(copies):
            if i % 2:
                grant_credits.apply_async(args=[f"k{i}", f"u{i}", i], task_id=tid, queue=IDEM_QUEUE, countdown=countdown)
            else:
                app.send_task("billing.grant_credits", args=[f"k{i}"], kwargs={"user": f"u{i}", "balance": i},
                              task_id=tid, queue=IDEM_QUEUE, countdown=countdown)
            sent += 1
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    app.send_task("billing.grant_credits", args=["kx", "ux", 1], task_id=f"{PREFIX}-t-expired", queue=IDEM_QUEUE, expires=past)
    return {"sent": sent + 1}


def wait(n, timeout):
    """Read every result as a Celery client does."""
    statuses = {}
    for i in range(n):
        r = AsyncResult(f"{PREFIX}-t-{i}", app=app)
        value = r.get(timeout=timeout)
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if value != {"user": f"u{i}", "balance": i}:
            return {"error": f"task {i} returned {value!r}"}
    expired = AsyncResult(f"{PREFIX}-t-expired", app=app)
    if BROKER.startswith("amqp"):
        # Celery gives the message a TTL from expires (0 when past), so
        # RabbitMQ drops it unless a consumer takes it at once: no result.
        return {"statuses": statuses, "expired": expired.status, "expired_error": None}
    try:
        expired.get(timeout=timeout)
        expired_error = None
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        expired_error = type(e).__name__
    return {"statuses": statuses, "expired": expired.status, "expired_error": expired_error}


def mixed(n, timeout):
    """n tasks for the Celery worker and n for Idem, on one broker."""
    celery_side = [add.apply_async(args=[i, i], queue=CELERY_QUEUE) for i in range(n)]
    idem_side = [grant_credits.apply_async(args=[f"m{i}", f"mu{i}", i], queue=IDEM_QUEUE) for i in range(n)]
    sums = [r.get(timeout=timeout) for r in celery_side]
    idem = [r.get(timeout=timeout) for r in idem_side]
    return {"sums_ok": sums == [2 * i for i in range(n)], "idem": [r.status for r in idem_side].count("SUCCESS"),
            "idem_values_ok": idem == [{"user": f"mu{i}", "balance": i} for i in range(n)]}


def natural(timeout):
    """Two task ids carrying one business key (the first argument): the
    second is a duplicate, answered with the result stored for the first."""
    first = grant_credits.apply_async(args=["nk", "nu", 42], task_id=f"{PREFIX}-n-1", queue=IDEM_QUEUE)
    value = first.get(timeout=timeout)
    second = grant_credits.apply_async(args=["nk", "nu", 42], task_id=f"{PREFIX}-n-2", queue=IDEM_QUEUE)
    return {"first": value, "second": second.get(timeout=timeout), "status": second.status}


def unreadable_body(task_id):
    """A message with task headers whose body cannot be read (on Redis, its
    base64; on RabbitMQ, its JSON), and one that is no Celery message."""
    headers = {"task": "billing.grant_credits", "id": task_id, "retries": 0}
    if BROKER.startswith("redis"):
        bad = {
            "body": "***not base64***", "content-encoding": "utf-8", "content-type": "application/json",
            "headers": headers,
            "properties": {"correlation_id": task_id, "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                           "delivery_info": {"exchange": "", "routing_key": IDEM_QUEUE}, "priority": 0},
        }
        r = redis.Redis.from_url(BROKER)
        r.lpush(IDEM_QUEUE, json.dumps(bad))
        r.lpush(IDEM_QUEUE, b"not json at all")
        return
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        for body, h in [(b"***not json***", headers), (b'{"hello": "world"}', {})]:
            producer.publish(body, exchange="", routing_key=IDEM_QUEUE, headers=h, serializer=None,
                             content_type="application/json", content_encoding="utf-8", delivery_mode=2)


def malformed(timeout):
    """What Idem must refuse, each with its reason, then a good task."""
    app.send_task("nobody.serves_this", args=[1], task_id=f"{PREFIX}-t-unknown", queue=IDEM_QUEUE)
    # A chain's first task is sent, carrying the rest; the result returned
    # is the last task's, whose parent is the one sent.
    chained = chain(grant_credits.si("c1", "cu", 1), grant_credits.si("c2", "cu", 2)).apply_async(queue=IDEM_QUEUE)
    v1 = Celery("celery_v1", broker=BROKER)
    v1.conf.task_protocol = 1
    v1.send_task("billing.grant_credits", args=["k1", "u1", 1], task_id=f"{PREFIX}-t-protocol1", queue=IDEM_QUEUE)
    unreadable_body(f"{PREFIX}-t-base64")
    good = grant_credits.apply_async(args=["g", "good", 7], task_id=f"{PREFIX}-t-good", queue=IDEM_QUEUE)
    good.get(timeout=timeout)
    failures = {}
    ids = {"unknown": f"{PREFIX}-t-unknown", "chain": chained.parent.id, "protocol1": f"{PREFIX}-t-protocol1", "base64": f"{PREFIX}-t-base64"}
    for label, tid in ids.items():
        res = AsyncResult(tid, app=app)
        try:
            res.get(timeout=timeout)
            failures[label] = None
        except Exception as e:  # noqa: BLE001 - the reason is what is checked
            failures[label] = f"{type(e).__name__}: {e}"
    return {"good": good.status, "failures": failures}


if __name__ == "__main__":
    cmd, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    out = {"send": send, "wait": wait, "mixed": mixed, "natural": natural, "malformed": malformed}[cmd](*args)
    print(json.dumps(out), flush=True)
