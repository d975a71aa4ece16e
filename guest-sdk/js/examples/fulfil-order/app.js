// Fulfil an order in three keyed steps: charge, reserve stock, send email
// (JavaScript). Each step is an external call keyed by (message key, step),
// so an attempt that dies after the charge resumes with the reservation on
// the next attempt, and the customer is charged once. The same plugin as
// plugins/fulfil-order in Rust.

import { call, collection, handler, info } from "./idem.js";

export const handle = handler((msg) => {
  const order = msg.json();
  const charge = call("payments-api", "charge", {
    reference: order.order_id,
    customer: order.customer,
    amount_cents: order.amount_cents,
  });
  info(`order ${order.order_id} charged`);
  const reservation = call("inventory-api", "reserve", {
    reference: order.order_id,
    sku: order.sku,
    quantity: order.quantity,
  });
  const email = call("email-api", "send-email", {
    reference: order.order_id,
    to: order.email,
    template: "order-confirmed",
  });
  collection("orders").upsert(order.order_id, { status: "fulfilled", charge, reservation, email });
});
