// Record a payment and charge the customer, exactly once (JavaScript).
// The payment id is the natural key: insertUnique on it makes the record
// idempotent, and the charge is a keyed external call, so a redelivery
// neither writes a second row nor charges twice. The same plugin as
// plugins/record-payment in Rust.

import { Permanent, call, collection, handler } from "./idem.js";

export const handle = handler((msg) => {
  const payment = msg.json();
  const previous = collection("payments").insertUnique(payment.payment_id, payment);
  if (previous !== undefined && JSON.stringify(previous) !== JSON.stringify(payment)) {
    throw new Permanent(`payment ${payment.payment_id} already recorded with different content`);
  }
  const receipt = call("payments-api", "charge", {
    reference: payment.payment_id,
    customer: payment.customer,
    amount_cents: payment.amount_cents,
  });
  collection("receipts").upsert(payment.payment_id, receipt);
});
