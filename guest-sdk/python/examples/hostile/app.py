"""A hostile handler: what a broken or malicious Python plugin could try.

Idem's tests run each mode and check that it is contained.
"""

from idem import Message, WitWorld, collection, handler, info  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    mode = msg.json()["mode"]
    if mode == "loop":
        x = 0
        while True:
            x += 1
    if mode == "memory":
        hoard = []
        while True:
            hoard.append(bytearray(b"\x01" * (1 << 20)))
    if mode == "huge-result":
        raise RuntimeError("r" * (2 << 20))
    if mode == "huge-value":
        collection("hostile").upsert(msg.key, "v" * ((1 << 20) + 1024))
        return
    if mode == "huge-log":
        line = "x" * (16 * 1024)
        for _ in range(300):
            info(line)
        return
    collection("hostile").upsert(msg.key, "ok")
