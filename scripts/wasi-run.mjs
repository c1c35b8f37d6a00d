// Runs a wasm32-wasip1 program under Node's WASI, as cargo's target runner
// (CARGO_TARGET_WASM32_WASIP1_RUNNER="node scripts/wasi-run.mjs"): `wasi-run.mjs
// prog.wasm args...`. The working directory is preopened as `.`, so tests that read
// files by relative path find them; the exit code is the program's.
import { readFile } from "node:fs/promises";
import process, { argv, env, exit } from "node:process";

// Node warns that WASI is experimental on every run; any other warning still prints.
process.removeAllListeners("warning");
process.on("warning", (w) => w.name === "ExperimentalWarning" || console.warn(w));
const { WASI } = await import("node:wasi");

const [prog, ...args] = argv.slice(2);
if (!prog) {
  console.error("usage: node wasi-run.mjs prog.wasm [args...]");
  exit(2);
}
const wasi = new WASI({
  version: "preview1",
  args: [prog, ...args],
  env,
  preopens: { ".": "." },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(prog));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
