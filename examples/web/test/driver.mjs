// The page in headless Chromium, driven over WebDriver (Debian's chromium-driver; plain
// HTTP from Node, so no npm package), served by `python3 -m http.server`: what the page's
// test (page.test.mjs) and its speed script (speed.mjs) share.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

const children = [];
let profile;
let base; // the WebDriver session's URL

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

export async function sleep(ms) {
  await new Promise((r) => setTimeout(r, ms));
}

/** One WebDriver command; its `value`, or an exception with the driver's message. */
export async function wd(method, path, body) {
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
export const js = (fn, ...args) => wd("POST", "/execute/sync", { script: `return (${fn})(...arguments)`, args });
/** The WebDriver reference of the element `css` selects (an object of one field). */
export const el = async (css) => Object.values(await wd("POST", "/element", { using: "css selector", value: css }))[0];
export const click = async (css) => wd("POST", `/element/${await el(css)}/click`, {});
/** Types into a field as a person would: clears it, then sends the keys. */
export async function type(css, text) {
  const id = await el(css);
  await wd("POST", `/element/${id}/clear`, {});
  await wd("POST", `/element/${id}/value`, { text: String(text) });
}
export const text = (css) => js((css) => document.querySelector(css).textContent, css);
export const state = () => js(() => document.getElementById("status").dataset.state);

/** Waits (at most `ms`) until `cond()` is truthy; its value. */
export async function until(cond, what, ms = 60_000) {
  const t0 = Date.now();
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}: ${await text("#status")}`);
    await sleep(50);
  }
}

/** Serves `dir`, opens it in a fresh headless Chromium and waits until the bundled model
 *  has loaded. */
export async function openPage(dir) {
  const port = await freePort();
  await start("python3", ["-u", "-m", "http.server", String(port), "--bind", "127.0.0.1", "--directory", dir], /Serving HTTP/);
  const driverPort = await freePort();
  await start("chromedriver", [`--port=${driverPort}`], /started successfully/);
  profile = mkdtempSync(join(tmpdir(), "kvm-web-chromium-"));
  // Offline flags: without them Chromium's background connections to Google hosts hang.
  const args = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    `--user-data-dir=${profile}`, "--window-size=960,720", "--enable-precise-memory-info",
    // Containers often give /dev/shm 64 MB, less than a large model's page needs.
    "--disable-dev-shm-usage",
  ];
  const r = await fetch(`http://127.0.0.1:${driverPort}/session`, {
    method: "POST",
    body: JSON.stringify({
      capabilities: {
        alwaysMatch: { browserName: "chrome", "goog:chromeOptions": { binary: process.env.CHROMIUM ?? "/usr/bin/chromium", args } },
      },
    }),
  });
  const { value } = await r.json();
  if (!r.ok) throw new Error(`chromedriver: ${value.message}`);
  base = `http://127.0.0.1:${driverPort}/session/${value.sessionId}`;
  await wd("POST", "/url", { url: `http://127.0.0.1:${port}/` });
  await until(async () => (await state()) === "idle", "the bundled model to load");
}

// Interrupted, the browser, its driver and the server end too.
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => closePage().finally(() => process.exit(130)));
}

/** Ends the browser session, the driver and the server. */
export async function closePage() {
  if (base) await wd("DELETE", "", undefined).catch(() => {});
  base = undefined;
  for (const c of children.splice(0)) c.kill();
  if (profile) rmSync(profile, { recursive: true, force: true });
}
