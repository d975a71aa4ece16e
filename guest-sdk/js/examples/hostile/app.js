// A hostile handler: what a broken or malicious JavaScript plugin could try.
// Idem's tests run each mode and check that it is contained.

import { Permanent, collection, handler, info } from "./idem.js";

// What an earlier message's instance would leave here if its memory were not
// reset: the "residue" mode checks it is empty, then fills it.
const residue = [];

export const handle = handler((msg) => {
  const { mode } = msg.json();
  if (mode === "loop") {
    for (;;) {}
  }
  if (mode === "memory") {
    const hoard = [];
    for (;;) hoard.push(new Uint8Array(1 << 20).fill(1));
  }
  if (mode === "huge-result") throw new Error("r".repeat(2 << 20));
  if (mode === "huge-value") {
    collection("hostile").upsert(msg.key, "v".repeat((1 << 20) + 1024));
    return;
  }
  if (mode === "huge-log") {
    const line = "x".repeat(16 * 1024);
    for (let i = 0; i < 300; i++) info(line);
    return;
  }
  if (mode === "residue") {
    if (residue.length) throw new Permanent(`memory of an earlier message: ${residue.length} entries`);
    residue.push(new Uint8Array(1 << 20).fill(0xab));
    collection("hostile").upsert(msg.key, "clean");
    return;
  }
  collection("hostile").upsert(msg.key, "ok");
});
