// The browser build (web/: an ES module, initialised with the wasm bytes) gives the same
// greedy text as `kvm generate`, run here in Node as a page's worker would run it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

test("web build: greedy text equal to kvm generate --temperature 0", async () => {
  const dir = join(process.env.KVM_WASM_PKG, "web");
  const kvm = await import(pathToFileURL(join(dir, "kvm_wasm.js")).href);
  kvm.initSync({ module: readFileSync(join(dir, "kvm_wasm_bg.wasm")) });
  const model = new kvm.Model(readFileSync(process.env.KVM_MODEL));
  const s = new kvm.Session(model);
  s.setSampler({ temperature: 0 });
  s.prefill(model.tokenize(process.env.KVM_PROMPT));
  assert.equal(process.env.KVM_PROMPT + s.generate(64), process.env.KVM_WANT);
});
