"""The Python SDK's behaviour: values, errors, and how failures reach the host."""

import json
import unittest

from tests import fakes  # installs the fake bindings before `idem` is imported

import idem  # noqa: E402
from idem import Message, Permanent, Transient  # noqa: E402


def raw(payload: bytes = b"{}", headers=None) -> fakes.Message:
    return fakes.Message(id="m-1", key="k-1", attempt=1, headers=headers or [], payload=payload)


def run(fn, msg=None):
    """Register `fn`, call the export as the host would; return the error variant or None."""
    idem.handler(fn)
    try:
        idem.WitWorld().handle(msg or raw())
    except fakes.Err as e:
        return e.value
    return None


class MessageTests(unittest.TestCase):
    def test_fields_json_and_headers(self):
        m = Message(raw(b'{"a": 1}', [("Content-Type", "application/json"), ("x", "1"), ("X", "2")]))
        self.assertEqual((m.id, m.key, m.attempt), ("m-1", "k-1", 1))
        self.assertEqual(m.json(), {"a": 1})
        self.assertEqual(m.header("content-type"), "application/json")
        self.assertEqual(m.header("X"), "1", "the first of repeated headers")
        self.assertIsNone(m.header("missing"))

    def test_invalid_json_is_permanent(self):
        with self.assertRaises(Permanent) as cm:
            Message(raw(b"{not json")).json()
        self.assertIn("not valid JSON", str(cm.exception))


class StoreTests(unittest.TestCase):
    def setUp(self):
        fakes.reset()

    def test_insert_unique_returns_the_existing_value(self):
        c = idem.collection("payments")
        self.assertIsNone(c.insert_unique("p-1", {"amount": 5}))
        self.assertEqual(c.insert_unique("p-1", {"amount": 6}), {"amount": 5})
        self.assertEqual(json.loads(fakes.store.data[("payments", "p-1")]), {"amount": 5})

    def test_upsert_get_delete(self):
        c = idem.collection("credits")
        self.assertIsNone(c.get("u"))
        c.upsert("u", 250)
        c.upsert("u", 300)
        self.assertEqual(c.get("u"), 300)
        self.assertTrue(c.delete("u"))
        self.assertFalse(c.delete("u"))
        self.assertEqual(fakes.store.data, {})

    def test_values_are_compact_json(self):
        idem.collection("c").upsert("k", {"a": [1, 2], "b": "x"})
        self.assertEqual(fakes.store.data[("c", "k")], b'{"a":[1,2],"b":"x"}')

    def test_an_unavailable_store_is_transient(self):
        fakes.store.fail_next = fakes.store.StoreError_Unavailable("connection refused")
        with self.assertRaises(Transient) as cm:
            idem.collection("c").get("k")
        self.assertIn("connection refused", str(cm.exception))

    def test_denied_and_too_large_are_permanent(self):
        fakes.store.fail_next = fakes.store.StoreError_AccessDenied('may not use collection "secrets"')
        with self.assertRaises(Permanent):
            idem.collection("secrets").upsert("k", 1)
        fakes.store.fail_next = fakes.store.StoreError_TooLarge("value exceeds limits.max_value_bytes")
        with self.assertRaises(Permanent):
            idem.collection("c").insert_unique("k", "v")


class CallTests(unittest.TestCase):
    def setUp(self):
        fakes.reset()

    def test_request_and_answer_are_json(self):
        fakes.effects.answer = b'{"charge": "ch-1"}'
        self.assertEqual(idem.call("payments-api", "charge", {"amount": 5}), {"charge": "ch-1"})
        self.assertEqual(fakes.effects.calls, [("payments-api", "charge", b'{"amount":5}')])

    def test_call_errors_map_to_transient_and_permanent(self):
        fakes.effects.fail_next = fakes.effects.CallError_Transient("503")
        with self.assertRaises(Transient) as cm:
            idem.call("api", "step", {})
        self.assertIn("api/step: 503", str(cm.exception))
        for error in (fakes.effects.CallError_Permanent("400"), fakes.effects.CallError_AccessDenied("no grant")):
            fakes.effects.fail_next = error
            with self.assertRaises(Permanent):
                idem.call("api", "step", {})


class HandlerTests(unittest.TestCase):
    def setUp(self):
        fakes.reset()

    def test_returning_is_done(self):
        seen = []
        self.assertIsNone(run(lambda m: seen.append(m.key)))
        self.assertEqual(seen, ["k-1"])

    def test_a_returned_value_is_the_result_as_json(self):
        idem.handler(lambda m: {"user": m.key, "balance": 5})
        self.assertEqual(idem.WitWorld().handle(raw()), b'{"user": "k-1", "balance": 5}')
        idem.handler(lambda m: None)
        self.assertIsNone(idem.WitWorld().handle(raw()))

    def test_a_value_json_cannot_hold_is_permanent(self):
        e = run(lambda m: {1, 2})
        self.assertIsInstance(e, fakes.types.HandlerError_Permanent)
        self.assertIn("JSON cannot hold", e.value)

    def test_permanent_and_transient_reach_the_host(self):
        def permanent(_):
            raise Permanent("refused")

        def transient(_):
            raise Transient("later")

        self.assertEqual(run(permanent), fakes.types.HandlerError_Permanent("refused"))
        self.assertEqual(run(transient), fakes.types.HandlerError_Transient("later"))

    def test_any_other_exception_is_transient_and_named(self):
        def broken(m):
            return {}["missing"]

        e = run(broken)
        self.assertIsInstance(e, fakes.types.HandlerError_Transient)
        self.assertEqual(e.value, "KeyError: 'missing'")

    def test_invalid_payload_is_permanent(self):
        e = run(lambda m: m.json(), raw(b"\xff"))
        self.assertIsInstance(e, fakes.types.HandlerError_Permanent)

    def test_no_handler_is_permanent(self):
        idem._registered = None
        try:
            idem.WitWorld().handle(raw())
        except fakes.Err as e:
            self.assertIsInstance(e.value, fakes.types.HandlerError_Permanent)
            self.assertIn("@idem.handler", e.value.value)
        else:
            self.fail("a plugin without a handler must fail")

    def test_log_levels(self):
        idem.info("one")
        idem.error(42)
        self.assertEqual(fakes.log.lines, [(fakes.Level.INFO, "one"), (fakes.Level.ERROR, "42")])


if __name__ == "__main__":
    unittest.main()
