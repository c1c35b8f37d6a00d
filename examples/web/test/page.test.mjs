// The page as a person uses it, in headless Chromium (driver.mjs): it opens the page
// from a local `python3 -m http.server`, types the prompt, asks for 64 greedy tokens and
// reads the text off the page, which must be `kvm generate`'s byte for byte; a corrupt
// model chosen with the file picker shows the core's message and leaves the loaded model
// in place; a setting out of its range shows the sampler's; a second model dropped on the
// page generates the CLI's text too; Stop ends a long generation, whose memory stays
// flat. Run by scripts/web-test.sh, which sets:
//   KVM_WEB_DIR     the assembled page (scripts/web-serve.sh --assemble)
//   KVM_BIN         the CLI, whose text the page must show
//   KVM_WASM_PKG    the Node package, whose KvmError message the page must show
//   KVM_MODEL       the bundled model; KVM_BAD_MODEL a corrupt copy; KVM_DROP_MODEL another
//   KVM_SCREENSHOT  where the screenshot of the greedy text goes (a PNG)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, join } from "node:path";

import { click, closePage, el, js, openPage, sleep, state, text, type, until, wd } from "./driver.mjs";

const env = process.env;
const PROMPT = "And God said";
const kvm = createRequire(import.meta.url)(join(env.KVM_WASM_PKG, "node/kvm_wasm.js"));

/** `kvm generate`'s stdout for a greedy text (invalid UTF-8 as U+FFFD, as the page shows
 *  it), then the line end it closes with. */
function cli(model, n) {
  const args = ["generate", "--model", model, "--prompt", PROMPT, "-n", String(n), "--temperature", "0"];
  return execFileSync(env.KVM_BIN, args, { stdio: ["ignore", "pipe", "ignore"] });
}

/** Greedy `n` tokens from the page; the text it shows (prompt and continuation). */
async function generateGreedy(n) {
  await type("#prompt", PROMPT);
  await type("#max-tokens", n);
  await click("#greedy");
  await click("#generate");
  await until(async () => (await state()) === "done", "the generation to end");
  return text("#output");
}

before(() => openPage(env.KVM_WEB_DIR));
after(closePage);

test("the bundled model loads by default and shows its arena", async () => {
  assert.equal(await text("#model-name"), "tiny-kjv-q8_0.kvm");
  const arena = new kvm.Model(readFileSync(env.KVM_MODEL)).arenaLen;
  assert.equal(await text("#arena"), `${arena.toLocaleString("en")} B`);
});

test("64 greedy tokens of tiny-kjv: the page shows kvm generate's text", async () => {
  const shown = await generateGreedy(64);
  assert.equal(await js(() => document.getElementById("status").dataset.end), "length");
  assert.equal(await text("#tokens"), "64");
  assert.deepEqual(Buffer.from(shown + "\n"), cli(env.KVM_MODEL, 64));
  assert.match(await text("#rate"), /^\d+(\.\d)?$/);
  const png = Buffer.from(await wd("GET", "/screenshot"), "base64");
  writeFileSync(env.KVM_SCREENSHOT, png);
});

test("a corrupt model from the file picker: the core's message, the loaded model kept", async () => {
  const want = (() => {
    try {
      new kvm.Model(readFileSync(env.KVM_BAD_MODEL));
    } catch (e) {
      return `${e.name}: ${e.message}`;
    }
    throw new Error("the corrupt model loaded in Node");
  })();
  await wd("POST", `/element/${await el("#file")}/value`, { text: env.KVM_BAD_MODEL });
  await until(async () => (await state()) === "error", "the load to fail");
  assert.equal(await text("#error"), want);
  assert.equal(await text("#model-name"), "tiny-kjv-q8_0.kvm");
  assert.deepEqual(Buffer.from((await generateGreedy(16)) + "\n"), cli(env.KVM_MODEL, 16));
});

test("a setting out of its range: the sampler's message, nothing generated", async () => {
  await type("#temperature", "150");
  await click("#generate");
  await until(async () => (await state()) === "error", "the settings to be refused");
  assert.equal(await text("#error"), "KvmError: sampler settings: temperature must be in [0, 100]");
  assert.equal(await text("#output-text"), "");
});

test("a model dropped on the page loads and generates the CLI's text", async () => {
  const name = basename(env.KVM_DROP_MODEL);
  // A drop as the browser delivers one: a DragEvent whose DataTransfer holds the file.
  const dropped = (b64, name) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer();
    dt.items.add(new File([bytes], name));
    const target = document.getElementById("drop");
    for (const type of ["dragenter", "dragover", "drop"]) {
      target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
    }
  };
  await js(dropped, readFileSync(env.KVM_DROP_MODEL).toString("base64"), name);
  await until(async () => (await text("#model-name")) === name && (await state()) === "idle", "the dropped model");
  assert.deepEqual(Buffer.from((await generateGreedy(32)) + "\n"), cli(env.KVM_DROP_MODEL, 32));
});

test("Stop ends a long generation; the page answers throughout and memory stays flat", async () => {
  await type("#max-tokens", 10_000_000);
  await type("#temperature", "0.8");
  await click("#generate");
  // The page's thread answers each of these while the worker generates.
  const tokens = async () => Number((await text("#tokens")).replaceAll(",", ""));
  await until(async () => (await tokens()) >= 50, "50 tokens");
  const memory = async () => [await text("#arena"), await text("#wasm-memory")];
  const early = await memory();
  await until(async () => (await tokens()) >= 300, "300 tokens");
  await click("#stop");
  await until(async () => (await state()) === "done", "the generation to stop", 10_000);
  assert.equal(await js(() => document.getElementById("status").dataset.end), "stopped");
  const stopped = await tokens();
  assert.ok(stopped < 10_000_000);
  await sleep(300);
  assert.equal(await tokens(), stopped);
  assert.deepEqual(await memory(), early);
});
