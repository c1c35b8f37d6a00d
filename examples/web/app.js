// The page's thread: settings, drag and drop, drawing. The model runs in worker.js.
const $ = (id) => document.getElementById(id);
const BUNDLED = "tiny-kjv-q8_0.kvm";

const worker = new Worker("worker.js", { type: "module" });
const outText = $("output-text");

function bytes(n) {
  return n == null ? "–" : `${n.toLocaleString("en")} B`;
}

/** The status line; `data-state` is what a test waits on. */
function status(state, text) {
  const s = $("status");
  s.dataset.state = state;
  s.textContent = text ?? state;
}

function showError(message) {
  const e = $("error");
  e.textContent = message;
  e.hidden = false;
}

function showMemory(m) {
  $("wasm-memory").textContent = bytes(m.wasmBytes);
  // The worker's own heap where the engine exposes it, else the page's; else none.
  const heap = m.jsHeapBytes ?? performance.memory?.usedJSHeapSize ?? null;
  $("js-heap").textContent = heap == null ? "not exposed (see wasm memory)" : bytes(heap);
}

function setBusy(busy) {
  $("generate").disabled = busy;
  $("stop").disabled = !busy;
  $("file").disabled = busy;
}

function load(name, buffer) {
  status("loading", `loading ${name}`);
  $("error").hidden = true;
  setBusy(true);
  $("stop").disabled = true;
  worker.postMessage({ type: "load", name, bytes: buffer }, [buffer]);
}

async function loadFile(file) {
  if (file) load(file.name, await file.arrayBuffer());
}

/** The sampler's settings as `Session.setSampler` takes them (its checks are the core's);
 *  an empty field is left out, so it takes the CLI's default. */
function sampler() {
  const n = (id) => ($(id).value === "" ? undefined : Number($(id).value));
  return {
    temperature: n("temperature"),
    topK: n("top-k"),
    topP: n("top-p"),
    minP: n("min-p"),
    repeatPenalty: n("repeat-penalty"),
    repeatWindow: n("repeat-window"),
    seed: n("seed"),
  };
}

function generate(event) {
  event.preventDefault();
  $("error").hidden = true;
  const prompt = $("prompt").value;
  $("output-prompt").textContent = prompt;
  outText.textContent = "";
  $("tokens").textContent = "0";
  $("rate").textContent = "–";
  status("generating", "prefilling");
  setBusy(true);
  worker.postMessage({ type: "generate", prompt, sampler: sampler(), maxTokens: Number($("max-tokens").value) });
}

const handlers = {
  ready() {
    fetch(BUNDLED)
      .then((r) => (r.ok ? r.arrayBuffer() : Promise.reject(new Error(`${BUNDLED}: HTTP ${r.status}`))))
      .then((buf) => load(BUNDLED, buf))
      .catch((e) => {
        showError(`${e.message}; drop a .kvm file here instead`);
        status("idle");
      });
  },
  loaded(m) {
    $("model-name").textContent = m.name;
    $("model-info").textContent =
      `${bytes(m.size)} · vocabulary ${m.vocabLen} · arena ${bytes(m.arenaLen)}`;
    $("arena").textContent = bytes(m.arenaLen);
    setBusy(false);
    status("idle", "model loaded");
  },
  progress(m) {
    status("generating", `prefilling ${m.done} / ${m.total}`);
  },
  tokens(m) {
    outText.appendChild(document.createTextNode(m.text));
    $("tokens").textContent = m.tokens.toLocaleString("en");
    if (m.seconds > 0) $("rate").textContent = (m.tokens / m.seconds).toFixed(1);
    $("arena").textContent = bytes(m.arenaLen);
    status("generating", "generating");
  },
  done(m) {
    outText.appendChild(document.createTextNode(m.text));
    $("tokens").textContent = m.tokens.toLocaleString("en");
    if (m.seconds > 0) $("rate").textContent = (m.tokens / m.seconds).toFixed(1);
    setBusy(false);
    $("prefill").textContent = `${m.promptTokens} tokens, ${(m.prefillS * 1e3).toFixed(1)} ms`;
    status("done", `done: ${m.end}`);
    $("status").dataset.end = m.end;
  },
  error(m) {
    showError(`${m.name}: ${m.message}`);
    setBusy(false);
    status("error", `${m.during} failed`);
  },
};

worker.onmessage = ({ data }) => {
  if (data.memory) showMemory(data.memory);
  handlers[data.type](data);
};
worker.onerror = (e) => {
  showError(`the worker failed: ${e.message}`);
  status("error", "worker failed");
};

$("settings").addEventListener("submit", generate);
$("stop").addEventListener("click", () => worker.postMessage({ type: "stop" }));
$("greedy").addEventListener("click", () => ($("temperature").value = "0"));
$("file").addEventListener("change", (e) => loadFile(e.target.files[0]));

// Drop a .kvm anywhere on the page.
const drop = $("drop");
document.addEventListener("dragover", (e) => {
  e.preventDefault();
  drop.classList.add("over");
});
document.addEventListener("dragleave", () => drop.classList.remove("over"));
document.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (!$("file").disabled) loadFile(e.dataTransfer.files[0]);
});
