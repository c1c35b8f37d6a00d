// Prefill and decode speed of the JS API in Node, as `kvm bench` measures natively:
//   node kvm-wasm/bench/speed.mjs PKG MODEL [PROMPT_LEN] [GEN]
// PKG is a package built by scripts/wasm-pkg.sh (KVM_WASM_SCALAR=1 for the scalar build).
// Prefill feeds PROMPT_LEN tokens (default 512) into a fresh session; decode times GEN
// greedy tokens (default 128) from a one-token context. An end-of-text pick is not fed
// (it ends a text), so the loop feeds the first token again instead: still one step.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const [pkg, path, promptLen = "512", gen = "128"] = process.argv.slice(2);
const kvm = createRequire(import.meta.url)(join(pkg, "node/kvm_wasm.js"));
let t0 = performance.now();
const model = new kvm.Model(readFileSync(path));
const loadS = (performance.now() - t0) / 1e3;

const text = "And God said, Let there be light: and there was light. ";
let ids = model.tokenize(text.repeat(Math.ceil(Number(promptLen) / 4)));
ids = ids.subarray(0, Number(promptLen));
const s = new kvm.Session(model);
t0 = performance.now();
s.prefill(ids);
const prefillS = (performance.now() - t0) / 1e3;

const d = new kvm.Session(model);
d.setSampler({ temperature: 0 });
d.prefill(ids.subarray(0, 1));
t0 = performance.now();
for (let i = 0; i < Number(gen); i++) {
  if (d.next() === undefined) d.prefill(ids.subarray(0, 1));
}
const decodeS = (performance.now() - t0) / 1e3;
console.log(
  JSON.stringify({
    model: path,
    load_s: +loadS.toFixed(2),
    arena_bytes: model.arenaLen,
    prefill_tok_s: +(ids.length / prefillS).toFixed(1),
    decode_tok_s: +(Number(gen) / decodeS).toFixed(1),
  }),
);
