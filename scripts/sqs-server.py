"""The SQS-compatible server the tests use: moto's server mode, with one
change for speed. moto checks each message's visibility against the
current time on every send, receive and delete, and it reads the time as
a datetime difference, which makes those calls several times slower than
the rest of the request once a queue holds a few thousand messages. The
current time is read with time.time() instead (the same value, unfrozen in
server mode). Arguments are moto_server's.
"""

import sys
import time

import moto.core.utils as utils
from moto.server import main

_unix_time = utils.unix_time


def unix_time(dt=None):
    return time.time() if dt is None else _unix_time(dt)


utils.unix_time = unix_time

if __name__ == "__main__":
    main(sys.argv[1:])
