// A handler that always fails, to show that poison is bounded (JavaScript).
// {"mode": "permanent"} is dead-lettered at once; "transient" is retried
// until the attempt limit; "trap" throws an unexpected error, which Idem
// retries like a transient failure.

import { Permanent, Transient, handler } from "./idem.js";

export const handle = handler((msg) => {
  const poison = msg.json();
  if (poison.mode === "transient") throw new Transient("poison: this message never succeeds");
  if (poison.mode === "trap") throw new TypeError("poison: this message always throws");
  throw new Permanent("poison: this message is refused");
});
