// Set a user's credit balance: an absolute assignment, naturally idempotent
// (JavaScript; the same plugin as plugins/grant-credits in Rust). It returns
// the grant it applied: the message's result, stored with its claim.

import { collection, handler } from "./idem.js";

export const handle = handler((msg) => {
  const grant = msg.json();
  collection("credits").upsert(grant.user, grant.balance);
  return { user: grant.user, balance: grant.balance };
});
