// Prefill and decode speed of the page in headless Chromium, as the page shows them:
//   node examples/web/test/speed.mjs DIR MODEL [PROMPT_LEN] [GEN]
// DIR is the assembled page (scripts/web-serve.sh --assemble). MODEL is chosen with the
// page's file picker; the prompt is the first PROMPT_LEN bytes (default 512) of a
// repeated verse, GEN (default 128) tokens are generated greedily, and the page's own
// figures are printed: prompt tokens and prefill time, tokens and tokens/s.
import { basename, resolve } from "node:path";

import { click, closePage, el, js, openPage, state, text, type, until, wd } from "./driver.mjs";

const [dir, model, promptLen = "512", gen = "128"] = process.argv.slice(2);
await openPage(resolve(dir));
try {
  await wd("POST", `/element/${await el("#file")}/value`, { text: resolve(model) });
  const loaded = async () => (await text("#model-name")) === basename(model) && (await state()) === "idle";
  const failed = async () => (await state()) === "error";
  await until(async () => (await loaded()) || (await failed()), "the model to load", 300_000);
  if (await failed()) throw new Error(await text("#error"));
  const verse = "And God said, Let there be light: and there was light. ";
  const prompt = verse.repeat(Math.ceil(Number(promptLen) / verse.length)).slice(0, Number(promptLen));
  // Set, not typed: typing hundreds of keys is not what is timed here.
  await js((p) => (document.getElementById("prompt").value = p), prompt);
  await type("#max-tokens", gen);
  await click("#greedy");
  await click("#generate");
  await until(async () => (await state()) === "done", "the generation to end", 600_000);
  const [promptTokens, prefillMs] = (await text("#prefill")).match(/[\d.]+/g).map(Number);
  console.log(
    JSON.stringify({
      model,
      browser: await js(() => navigator.userAgent.match(/Chrom\w+\/[\d.]+/)[0]),
      prompt_tokens: promptTokens,
      prefill_tok_s: +(promptTokens / (prefillMs / 1e3)).toFixed(1),
      tokens: Number((await text("#tokens")).replaceAll(",", "")),
      decode_tok_s: Number(await text("#rate")),
      arena: await text("#arena"),
      wasm_memory: await text("#wasm-memory"),
    }),
  );
} finally {
  await closePage();
}
