// Set a user's credit balance: an absolute assignment, naturally idempotent
// (JavaScript; the same plugin as plugins/grant-credits in Rust).

import { collection, handler } from "./idem.js";

export const handle = handler((msg) => {
  const grant = msg.json();
  collection("credits").upsert(grant.user, grant.balance);
});
