// Does nothing: the cost of the sandbox and the pipeline alone (JavaScript).

import { handler } from "./idem.js";

export const handle = handler(() => {});
