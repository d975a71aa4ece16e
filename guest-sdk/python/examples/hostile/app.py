"""A hostile handler: what a broken or malicious Python plugin could try.

Idem's tests run each mode and check that it is contained.
"""

from idem import Message, Permanent, WitWorld, collection, handler, info  # noqa: F401 (WitWorld is the export)

# What an earlier message's instance would leave here if its memory were not
# reset: the "residue" mode checks it is empty, then fills it.
_residue: list = []


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
    if mode == "residue":
        if _residue:
            raise Permanent(f"memory of an earlier message: {len(_residue)} entries")
        _residue.append(bytearray(b"\xab" * (1 << 20)))
        collection("hostile").upsert(msg.key, "clean")
        return
    collection("hostile").upsert(msg.key, "ok")
