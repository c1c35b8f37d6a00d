// The JS API against the CLI: greedy and sampled text equal to `kvm generate`'s, a state
// save/restore round trip, and a bad model refused with the core's message. Run by
// `bash scripts/wasm-pkg.sh --test`, which passes the package, the model, the CLI and the
// CLI's texts in the environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { readFileSync, writeFileSync, mkdtempSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";

const env = (name) => {
  const v = process.env[name];
  assert.ok(v !== undefined, `${name} is not set: run scripts/wasm-pkg.sh --test`);
  return v;
};
const kvm = createRequire(import.meta.url)(join(env("KVM_WASM_PKG"), "node/kvm_wasm.js"));
const blob = readFileSync(env("KVM_MODEL"));
const prompt = env("KVM_PROMPT");
const model = new kvm.Model(blob);

function started(settings) {
  const s = new kvm.Session(model);
  s.setSampler(settings);
  s.prefill(model.tokenize(prompt));
  return s;
}

test("greedy: 64 tokens equal to kvm generate --temperature 0", () => {
  const s = started({ temperature: 0 });
  const pieces = [];
  const text = s.generate(64, (p) => pieces.push(p));
  assert.equal(prompt + text, env("KVM_WANT"));
  assert.equal(pieces.join(""), text);
  assert.equal(s.arenaLen, model.arenaLen);
});

test("next(), piece by piece, gives generate()'s text", () => {
  const s = started({ temperature: 0 });
  let text = "";
  for (let i = 0; i < 64; i++) {
    const piece = s.next();
    if (piece === undefined) break;
    text += piece;
  }
  assert.equal(prompt + text, env("KVM_WANT"));
});

test("sampled: the CLI's settings and seed give the CLI's text", () => {
  const s = started({ temperature: 0.8, topP: 0.9, minP: 0.05, repeatPenalty: 1.1, seed: 7 });
  assert.equal(prompt + s.generate(64), env("KVM_WANT_SAMPLED"));
});

test("sampled: a new session's sampler is the CLI's defaults", () => {
  const s = new kvm.Session(model);
  s.prefill(model.tokenize(prompt));
  assert.equal(prompt + s.generate(64), env("KVM_WANT_DEFAULT"));
});

test("temperature 100 over every byte: invalid UTF-8 as U+FFFD, as kvm generate prints it", () => {
  // Near-uniform picks among tiny-kjv's 256 byte tokens: lone and broken-off UTF-8 lead
  // bytes, stray continuation bytes, and (seed 2) two whole two-byte characters.
  const settings = { temperature: 100, topK: 0, topP: 1, minP: 0, seed: 2 };
  const s = started(settings);
  const args = ["--temperature", "100", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "2"];
  const cli = execFileSync(env("KVM_BIN"), ["generate", "--model", env("KVM_MODEL"), "--prompt", prompt, "-n", "64", ...args], {
    stdio: ["ignore", "pipe", "ignore"],
  });
  const text = prompt + s.generate(64);
  assert.ok(text.includes("\uFFFD"));
  // The CLI ends its text with a line end.
  assert.deepEqual(Buffer.from(text + "\n"), cli);
});

test("sampler settings out of range are a KvmError", () => {
  const s = new kvm.Session(model);
  for (const bad of [{ topP: 0 }, { temperature: -1 }, { minP: 2 }, { repeatPenalty: 0 }, { seed: 1.5 }, { topK: "x" }]) {
    assert.throws(() => s.setSampler(bad), { name: "KvmError" }, JSON.stringify(bad));
  }
  assert.throws(() => s.next(), { name: "KvmError" });
  assert.throws(() => s.prefill(new Uint32Array(0)), { name: "KvmError" });
});

test("sampler settings take the CLI's and the C API's ranges, named in the message", () => {
  const s = new kvm.Session(model);
  const refused = (settings, message) =>
    assert.throws(() => s.setSampler(settings), { name: "KvmError", message: `sampler settings: ${message}` });
  refused({ temperature: 101 }, "temperature must be in [0, 100]");
  refused({ topP: 0 }, "topP must be in (0, 1]");
  refused({ minP: NaN }, "minP must be in [0, 1]");
  refused({ repeatPenalty: 100.5 }, "repeatPenalty must be in (0, 100]");
  refused({ repeatWindow: 257 }, "repeatWindow must be in [0, 256]");
  s.setSampler({ temperature: 100, topP: 1, minP: 1, repeatPenalty: 100, repeatWindow: 256 });
});

test("prefill reports progress up to the prompt's length", () => {
  const s = new kvm.Session(model);
  const ids = model.tokenize(prompt.repeat(20));
  const calls = [];
  s.prefill(ids, (done, total) => calls.push([done, total]));
  assert.ok(calls.length > 1);
  assert.deepEqual(calls.at(-1), [ids.length, ids.length]);
  calls.forEach(([done, total], i) => {
    assert.equal(total, ids.length);
    assert.ok(i === 0 || done > calls[i - 1][0]);
  });
  assert.equal(s.pos, ids.length);
});

test("state: save after prefill, restore, generate again: the same text and logits", () => {
  const s = started({ temperature: 0 });
  const saved = s.saveState();
  const first = s.generate(32);
  const firstLogits = s.logits();
  assert.ok(firstLogits instanceof Float32Array);
  assert.equal(firstLogits.length, model.vocabLen);
  s.restoreState(saved);
  assert.equal(s.generate(32), first);
  assert.deepEqual(s.logits(), firstLogits);
  // Into a fresh session of the same model too.
  const t = new kvm.Session(model);
  t.setSampler({ temperature: 0 });
  t.restoreState(saved);
  assert.equal(t.generate(32), first);
  // A flipped byte anywhere is refused, and the session is unchanged.
  const posBefore = t.pos;
  for (const at of [0, saved.length >> 1, saved.length - 1]) {
    const bad = Uint8Array.from(saved);
    bad[at] ^= 1;
    assert.throws(() => t.restoreState(bad), { name: "KvmError" });
  }
  assert.equal(t.pos, posBefore);
});

// CRC-32 (IEEE, reflected), as the core's `crc::crc32`.
function crc32(bytes) {
  let c = ~0;
  for (const b of bytes) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

const u32le = (x) => Uint8Array.of(x & 0xff, (x >>> 8) & 0xff, (x >>> 16) & 0xff, x >>> 24);

test("state: the logits are in the core's snapshot; a state of the earlier layout still loads", () => {
  const s = started({ temperature: 0 });
  const saved = s.saveState();
  const logits = s.logits();
  const first = s.generate(16);
  // The core's snapshot with logits (FORMAT.md, "Session snapshots"): the state, then
  // the logits, counter word 8 bit 0 set, the CRC (word 7) over every other byte.
  const stateLen = saved.length - 4 * model.vocabLen;
  assert.equal(saved[32], 1, "flags: logits follow");
  assert.deepEqual(new Float32Array(saved.slice(stateLen).buffer), logits);
  // The earlier layout: the state alone (flags 0, its CRC made right), the logits,
  // their CRC-32.
  const core = saved.slice(0, stateLen);
  core[32] = 0;
  const crc = crc32([...core.subarray(0, 28), ...core.subarray(32)]);
  core.set(u32le(crc), 28);
  const tail = saved.slice(stateLen);
  const earlier = Uint8Array.from([...core, ...tail, ...u32le(crc32(tail))]);
  const t = new kvm.Session(model);
  t.setSampler({ temperature: 0 });
  t.restoreState(earlier);
  assert.deepEqual(t.logits(), logits);
  assert.equal(t.generate(16), first);
  const bad = Uint8Array.from(earlier);
  bad[bad.length - 5] ^= 1;
  assert.throws(() => t.restoreState(bad), { name: "KvmError" });
  // Before any prompt, the state alone; restored, there is nothing to pick from.
  const fresh = new kvm.Session(model).saveState();
  assert.equal(fresh.length, stateLen);
  t.restoreState(fresh);
  assert.equal(t.pos, 0);
  assert.throws(() => t.next(), { name: "KvmError" });
});

test("a model with one byte flipped is refused with the core's message", () => {
  const bad = Uint8Array.from(blob);
  bad[bad.length >> 1] ^= 1;
  let err;
  assert.throws(() => new kvm.Model(bad), (e) => ((err = e), e.name === "KvmError"));
  // The CLI wraps the same core error in its own context.
  const path = join(mkdtempSync(join(tmpdir(), "kvm-wasm-")), "bad.kvm");
  writeFileSync(path, bad);
  let cli = "";
  try {
    execFileSync(env("KVM_BIN"), ["info", "--model", path], { stdio: "pipe" });
  } catch (e) {
    cli = e.stderr.toString();
  }
  assert.ok(err.message.length > 0 && cli.includes(err.message), `"${err.message}" not in "${cli}"`);
  assert.throws(() => new kvm.Model(new Uint8Array(10)), { name: "KvmError" });
});
