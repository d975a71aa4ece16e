"""The SQS-compatible server the tests use: moto's server mode, with
changes for speed only. moto keeps a queue as one list and answers most
calls by walking it, so a call's cost grows with the queue; at 10,000
messages a single send or receive took a second. Here:

- the current time is read with time.time() (the same value, unfrozen in
  server mode) instead of a datetime difference;
- a queue's approximate counts are not computed inside a send or receive,
  which asked for every attribute of the queue (counts included) to read
  one setting; GetQueueAttributes computes them as before, in one pass
  over the queue with one clock read;
- a receipt handle finds its message through an index instead of a walk
  over the queue, for deletes and visibility changes;
- attribute names are converted to Python names once, not on every
  read of a queue's attributes (several per received message), and
  receipt handles are drawn from os.urandom, not letter by letter.

What each call answers is unchanged. Arguments are moto_server's.
"""

import functools
import os
import sys
import threading
import time

import moto.core.utils as utils
from moto.server import main
from moto.sqs import models
from moto.sqs.exceptions import InvalidParameterValue, ReceiptHandleIsInvalid

_unix_time = utils.unix_time


def unix_time(dt=None):
    return time.time() if dt is None else _unix_time(dt)


utils.unix_time = unix_time


def now_ms():
    return time.time() * 1000


# Counts are skipped while a send or receive runs (per request thread).
_quiet = threading.local()


def without_counts(method):
    def wrapped(*args, **kwargs):
        depth = getattr(_quiet, "depth", 0)
        _quiet.depth = depth + 1
        try:
            return method(*args, **kwargs)
        finally:
            _quiet.depth = depth

    return wrapped


for name in ("send_message", "send_message_batch", "receive_message"):
    setattr(models.SQSBackend, name, without_counts(getattr(models.SQSBackend, name)))


def counted(test):
    def count(queue):
        if getattr(_quiet, "depth", 0):
            return 0
        now = now_ms()
        return sum(1 for m in queue._messages if test(m, now))

    return property(count)


models.Queue.approximate_number_of_messages = counted(lambda m, now: now > m.visible_at and now >= m.delayed_until)
models.Queue.approximate_number_of_messages_not_visible = counted(lambda m, now: not now > m.visible_at)
models.Queue.approximate_number_of_messages_delayed = counted(lambda m, now: now < m.delayed_until)


def visible_messages(queue):
    now = now_ms()
    return [m for m in queue._messages if now > m.visible_at and now >= m.delayed_until]


models.Queue.messages = property(visible_messages)

# Every receipt handle a message was given, to the message.
_by_handle = {}
_mark_received = models.Message.mark_received


def mark_received(message, visibility_timeout=None):
    _mark_received(message, visibility_timeout)
    _by_handle[message.receipt_handle] = message


models.Message.mark_received = mark_received


def held(queue, receipt_handle):
    """The message of this queue that was given this handle, if any (a
    list's `in` compares by identity here: messages define no equality)."""
    message = _by_handle.get(receipt_handle)
    return message if message is not None and message in queue._messages else None


def delete_message(queue, receipt_handle):
    if receipt_handle in queue.deleted_messages:
        return
    message = held(queue, receipt_handle)
    if message is None:
        raise ReceiptHandleIsInvalid()
    queue.pending_messages.discard(message)
    queue.deleted_messages.update(message.all_receipt_handles)
    # A new list, as moto makes one: a walk over the old one elsewhere
    # sees it whole.
    at = queue._messages.index(message)
    queue._messages = queue._messages[:at] + queue._messages[at + 1 :]
    for handle in message.all_receipt_handles:
        _by_handle.pop(handle, None)


models.Queue.delete_message = delete_message


def change_message_visibility(backend, queue_name, receipt_handle, visibility_timeout):
    queue = backend.get_queue(queue_name)
    message = held(queue, receipt_handle)
    if message is None:
        raise ReceiptHandleIsInvalid
    if now_ms() + int(visibility_timeout) * 1000 - message.sent_timestamp > 43200 * 1000:
        raise InvalidParameterValue(
            f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. Reason: Total "
            "VisibilityTimeout for the message is beyond the limit [43200 seconds]"
        )
    message.change_visibility(visibility_timeout)
    if message.visible and message in queue.pending_messages:
        queue.pending_messages.remove(message)


models.SQSBackend.change_message_visibility = change_message_visibility
models.camelcase_to_underscores = functools.lru_cache(maxsize=None)(models.camelcase_to_underscores)
# The same length and alphabet as moto's (185 lowercase letters).
models.generate_receipt_handle = lambda: "".join(chr(97 + b % 26) for b in os.urandom(185))

if __name__ == "__main__":
    main(sys.argv[1:])
