// The page as a person uses it, in headless Chromium driven over WebDriver (Debian's
// chromium-driver; plain HTTP, so no npm package): it opens the page from a local
// `python3 -m http.server`, types the prompt, asks for 64 greedy tokens and reads the text
// off the page, which must be `kvm generate`'s byte for byte; a corrupt model chosen with
// the file picker shows the core's message and leaves the loaded model in place; a second
// model dropped on the page generates the CLI's text too; Stop ends a long generation,
// whose memory stays flat. Run by scripts/web-test.sh, which sets:
//   KVM_WEB_DIR     the assembled page (scripts/web-serve.sh --assemble)
//   KVM_BIN         the CLI, whose text the page must show
//   KVM_WASM_PKG    the Node package, whose KvmError message the page must show
//   KVM_MODEL       the bundled model; KVM_BAD_MODEL a corrupt copy; KVM_DROP_MODEL another
//   KVM_SCREENSHOT  where the screenshot of the greedy text goes (a PNG)
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

const env = process.env;
const PROMPT = "And God said";
const kvm = createRequire(import.meta.url)(join(env.KVM_WASM_PKG, "node/kvm_wasm.js"));
const children = [];
let profile;
let base; // the WebDriver session's URL
let page; // the page's URL

/** A TCP port free at the time of asking. */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

/** Starts `cmd`, resolving once a line of its output matches `ready`. */
function start(cmd, args, ready) {
  const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  return new Promise((resolve, reject) => {
    let seen = "";
    const look = (chunk) => {
      seen += chunk;
      if (ready.test(seen)) resolve(child);
    };
    child.stdout.on("data", look);
    child.stderr.on("data", look);
    child.on("exit", (code) => reject(new Error(`${cmd} exited (${code}): ${seen}`)));
  });
}

async function sleep(ms) {
  await new Promise((r) => setTimeout(r, ms));
}

/** One WebDriver command; its `value`, or an exception with the driver's message. */
async function wd(method, path, body) {
  const r = await fetch(base + path, {
    method,
    headers: { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const { value } = await r.json();
  if (!r.ok) throw new Error(`WebDriver ${method} ${path}: ${value.error}: ${value.message}`);
  return value;
}

/** Runs `fn` (a function's source) in the page with `args`; its result. */
const js = (fn, ...args) => wd("POST", "/execute/sync", { script: `return (${fn})(...arguments)`, args });
/** The WebDriver reference of the element `css` selects (an object of one field). */
const el = async (css) => Object.values(await wd("POST", "/element", { using: "css selector", value: css }))[0];
const click = async (css) => wd("POST", `/element/${await el(css)}/click`, {});
/** Types into a field as a person would: clears it, then sends the keys. */
async function type(css, text) {
  const id = await el(css);
  await wd("POST", `/element/${id}/clear`, {});
  await wd("POST", `/element/${id}/value`, { text: String(text) });
}
const text = (css) => js((css) => document.querySelector(css).textContent, css);
const state = () => js(() => document.getElementById("status").dataset.state);

/** Waits (at most `ms`) until `cond()` is truthy; its value. */
async function until(cond, what, ms = 60_000) {
  const t0 = Date.now();
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}: ${await text("#status")}`);
    await sleep(50);
  }
}

async function idle() {
  return until(async () => ["idle", "done", "error"].includes(await state()), "the page to be idle");
}

/** `kvm generate`'s stdout for a greedy text (invalid UTF-8 as U+FFFD, as the page shows it), then the line end it closes with. */
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

before(async () => {
  const port = await freePort();
  await start("python3", ["-u", "-m", "http.server", String(port), "--bind", "127.0.0.1", "--directory", env.KVM_WEB_DIR], /Serving HTTP/);
  page = `http://127.0.0.1:${port}/`;
  const driverPort = await freePort();
  await start("chromedriver", [`--port=${driverPort}`], /started successfully/);
  profile = mkdtempSync(join(tmpdir(), "kvm-web-chromium-"));
  // Offline flags: without them Chromium's background connections to Google hosts hang.
  const args = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    `--user-data-dir=${profile}`, "--window-size=960,720", "--enable-precise-memory-info",
  ];
  const r = await fetch(`http://127.0.0.1:${driverPort}/session`, {
    method: "POST",
    body: JSON.stringify({
      capabilities: {
        alwaysMatch: { browserName: "chrome", "goog:chromeOptions": { binary: env.CHROMIUM ?? "/usr/bin/chromium", args } },
      },
    }),
  });
  const { value } = await r.json();
  if (!r.ok) throw new Error(`chromedriver: ${value.message}`);
  base = `http://127.0.0.1:${driverPort}/session/${value.sessionId}`;
  await wd("POST", "/url", { url: page });
  await until(async () => (await state()) === "idle", "the bundled model to load");
});

after(async () => {
  if (base) await wd("DELETE", "", undefined).catch(() => {});
  for (const c of children) c.kill();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

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
