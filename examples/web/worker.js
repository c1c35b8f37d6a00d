// kvm's worker: owns the wasm module, the model and the session, so the page's thread
// only draws. Messages in: {type: "load", name, bytes} | {type: "generate", prompt,
// sampler, maxTokens} | {type: "stop"}. Messages out: "ready", "loaded", "progress",
// "tokens", "done", "error" (each below).
import init, { Model, Session } from "./kvm_wasm.js";

const wasm = await init();
let model = null;
let session = null;
let stopping = false;
let busy = false;

// A generation yields to the worker's event loop (so a "stop" gets through) once per
// slice, and posts the pieces of that slice at once: fast models post about 60 times a
// second instead of thousands, slow ones every token.
const SLICE_MS = 16;

/** Wasm memory (the model, the arena, everything the module allocates) and, where the
 *  engine tells (Chromium's `performance.memory`), the JS heap of this worker. */
function memory() {
  const heap = self.performance && performance.memory ? performance.memory.usedJSHeapSize : null;
  return { wasmBytes: wasm.memory.buffer.byteLength, jsHeapBytes: heap };
}

function post(msg) {
  self.postMessage({ ...msg, memory: memory() });
}

/** Resolves after one turn of the event loop (a message, not a timer: timers are
 *  clamped to 4 ms once nested). */
function yieldToEvents() {
  return new Promise((resolve) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = resolve;
    ch.port2.postMessage(null);
  });
}

function load({ name, bytes }) {
  // A model that fails validation replaces nothing: the previous one stays loaded.
  const next = new Model(new Uint8Array(bytes));
  session?.free();
  model?.free();
  model = next;
  session = new Session(model);
  post({ type: "loaded", name, size: bytes.byteLength, arenaLen: model.arenaLen, vocabLen: model.vocabLen });
}

async function generate({ prompt, sampler, maxTokens }) {
  if (!model) throw new Error("no model loaded");
  // A fresh session for each text, in the memory the previous one gave back.
  session?.free();
  session = null;
  session = new Session(model);
  session.setSampler(sampler);
  const ids = model.tokenize(prompt);
  let t0 = performance.now();
  session.prefill(ids, (done, total) => post({ type: "progress", done, total }));
  const prefillS = (performance.now() - t0) / 1e3;
  stopping = false;
  let tokens = 0;
  let end = "length";
  t0 = performance.now();
  while (tokens < maxTokens && end === "length") {
    const slice = performance.now() + SLICE_MS;
    let text = "";
    let n = 0;
    while (tokens + n < maxTokens && performance.now() < slice) {
      const piece = session.next();
      if (piece === undefined) {
        end = "eos";
        break;
      }
      text += piece;
      n++;
    }
    tokens += n;
    const seconds = (performance.now() - t0) / 1e3;
    post({ type: "tokens", text, tokens, seconds, arenaLen: session.arenaLen });
    await yieldToEvents();
    if (stopping) end = "stopped";
  }
  const seconds = (performance.now() - t0) / 1e3;
  // What a character left incomplete at the end held back (U+FFFD), as kvm generate ends.
  const text = session.finish();
  post({ type: "done", text, end, tokens, seconds, promptTokens: ids.length, prefillS, arenaLen: session.arenaLen });
}

self.onmessage = async ({ data }) => {
  if (data.type === "stop") {
    stopping = true;
    return;
  }
  if (busy) {
    post({ type: "error", name: "Error", message: "busy: stop the generation first", during: data.type });
    return;
  }
  busy = true;
  try {
    if (data.type === "load") load(data);
    else if (data.type === "generate") await generate(data);
  } catch (e) {
    // A KvmError carries the core's message; anything else is a bug worth seeing too.
    post({ type: "error", name: e.name ?? "Error", message: e.message ?? String(e), during: data.type });
  } finally {
    busy = false;
  }
};

post({ type: "ready" });
