#![doc = include_str!("../README.md")]

use std::ptr::NonNull;
use std::rc::Rc;

use js_sys::{Function, Uint8Array};
use kvm_core::sampler::ranges::{self, Shown};
use kvm_core::sampler::{scratch_len, Candidate, Recent, Sampler, SamplerConfig};
use kvm_core::tokenizer::StreamDecoder;
use wasm_bindgen::prelude::*;

/// A JavaScript `Error` named `KvmError` carrying `message`.
fn kvm_error(message: &str) -> JsValue {
    let e = js_sys::Error::new(message);
    e.set_name("KvmError");
    e.into()
}

/// The core's error as a `KvmError` with the core's message.
fn core_error(e: kvm_core::Error) -> JsValue {
    kvm_error(&e.to_string())
}

fn out_of_memory(what: &str, bytes: usize) -> JsValue {
    kvm_error(&format!("out of memory: {what} needs {bytes} bytes"))
}

/// An empty `Vec` with room for `len` items, or a `KvmError` if the memory is not there.
fn try_with_capacity<T>(len: usize, what: &str) -> Result<Vec<T>, JsValue> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| out_of_memory(what, len * size_of::<T>()))?;
    Ok(v)
}

/// A `Vec` of `len` copies of `fill`, or a `KvmError` if the memory is not there.
fn try_vec<T: Clone>(len: usize, fill: T, what: &str) -> Result<Vec<T>, JsValue> {
    let mut v = try_with_capacity(len, what)?;
    v.resize(len, fill);
    Ok(v)
}

/// One cache line: the model blob and the arena are held in these, 64-byte aligned as the
/// core wants its arena (and as a file mapped from disk gives its tensors).
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// At least `len` zeroed bytes, 64-byte aligned, owned through a raw pointer so that a
/// `'static` borrow of them (see [`Lines::bytes`]) aliases no `Box`.
struct Lines {
    ptr: NonNull<[Line]>,
    len: usize,
}

impl Lines {
    fn zeroed(len: usize, what: &str) -> Result<Lines, JsValue> {
        let lines = try_vec(len.div_ceil(64), Line([0; 64]), what)?;
        let ptr = NonNull::from(Box::leak(lines.into_boxed_slice()));
        Ok(Lines { ptr, len })
    }

    /// The first `len` bytes, for as long as the caller keeps `self` alive.
    ///
    /// # Safety
    /// At most one borrow at a time, and it must end before `self` is dropped.
    unsafe fn bytes(&self) -> &'static mut [u8] {
        // SAFETY: `ptr` came from `Box::leak` and stays valid until `drop`; the caller
        // promises the borrow is unique and ends before then.
        let lines: &'static mut [Line] = unsafe { &mut *self.ptr.as_ptr() };
        &mut bytemuck::cast_slice_mut(lines)[..self.len]
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `Box::leak` in `zeroed`, and every borrow of it has
        // ended (the owners declare the borrower before their `Lines`, so it drops first).
        drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
    }
}

/// A validated model and the bytes it borrows.
struct Loaded {
    /// Borrows `_blob`; declared first so that it is dropped first.
    model: kvm_core::Model<'static>,
    _blob: Lines,
}

/// A model, validated once (`Model::from_bytes`: header, tensor table, every checksum).
#[wasm_bindgen]
pub struct Model {
    loaded: Rc<Loaded>,
}

#[wasm_bindgen]
impl Model {
    /// Copies `bytes` into wasm memory (once: wasm cannot address a JavaScript buffer)
    /// and validates them. Throws a `KvmError` with the core's message for a bad model,
    /// or when memory runs out.
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: &Uint8Array) -> Result<Model, JsValue> {
        let blob = Lines::zeroed(bytes.length() as usize, "the model")?;
        // SAFETY: the only borrow of `blob`; `Loaded` keeps `blob` behind the model.
        let data = unsafe { blob.bytes() };
        bytes.copy_to(data);
        let model = kvm_core::Model::from_bytes(data).map_err(core_error)?;
        Ok(Model { loaded: Rc::new(Loaded { model, _blob: blob }) })
    }

    /// Bytes of wasm memory a session of this model takes for its arena.
    #[wasm_bindgen(getter, js_name = arenaLen)]
    pub fn arena_len(&self) -> usize {
        self.loaded.model.arena_len()
    }

    /// Token ids in the vocabulary (the length of `Session.logits()`).
    #[wasm_bindgen(getter, js_name = vocabLen)]
    pub fn vocab_len(&self) -> u32 {
        self.loaded.model.config().vocab_len
    }

    /// The token ids of `text`, as `Session.prefill` takes them.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsValue> {
        let mut ids = try_vec(text.len() + 1, 0u32, "the token ids")?;
        let len = self.loaded.model.tokenizer().encode(text, &mut ids).map_err(core_error)?;
        ids.truncate(len);
        Ok(ids)
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", self.loaded.model.config()).finish_non_exhaustive()
    }
}

#[wasm_bindgen(typescript_custom_section)]
const SAMPLER_SETTINGS: &str = r#"
/** `Session.setSampler`'s settings, as `kvm generate`'s flags; each absent one its default. */
export interface SamplerSettings {
    temperature?: number;
    topK?: number;
    topP?: number;
    minP?: number;
    repeatPenalty?: number;
    repeatWindow?: number;
    seed?: number;
}
"#;

/// Prompt tokens fed between two progress calls.
const PROGRESS_TOKENS: usize = 64;

/// A session: its arena in wasm memory (allocated once, `model.arenaLen` bytes), which
/// also holds the logits of the next pick, and a sampler with the CLI's settings.
#[wasm_bindgen]
pub struct Session {
    /// Borrows `arena` and `loaded`; declared first so that it is dropped first.
    session: kvm_core::Session<'static, 'static>,
    arena: Lines,
    loaded: Rc<Loaded>,
    sampler: Sampler,
    scratch: Vec<Candidate>,
    /// The recent tokens the repetition penalty reads.
    recent: Recent,
    /// Holds back a character split across tokens until it is whole (the core's
    /// incremental `from_utf8_lossy`, as `kvm generate` prints text).
    decoder: StreamDecoder,
    /// `[3 * (max_token_len + 3)]`: the decoder's output for one token.
    piece: Vec<u8>,
}

#[wasm_bindgen]
impl Session {
    /// A fresh session of `model`, sampling with `SamplerConfig::DEFAULT` and seed 0.
    #[wasm_bindgen(constructor)]
    pub fn new(model: &Model) -> Result<Session, JsValue> {
        let loaded = Rc::clone(&model.loaded);
        let m = loaded.model;
        let arena = Lines::zeroed(m.arena_len(), "the session's arena")?;
        // SAFETY: the only borrow of `arena`; the session is dropped before it.
        let session = kvm_core::Session::new(m, unsafe { arena.bytes() }).map_err(core_error)?;
        let vocab = m.config().vocab_len as usize;
        let cfg = SamplerConfig::DEFAULT;
        Ok(Session {
            session,
            arena,
            loaded,
            sampler: Sampler::new(cfg, 0),
            scratch: try_vec(scratch_len(vocab), Candidate::EMPTY, "the sampler's scratch")?,
            recent: Recent::new(cfg.repeat_window).map_err(core_error)?,
            decoder: StreamDecoder::new(),
            piece: try_vec(3 * (m.tokenizer().max_token_len() + 3), 0, "the text of a token")?,
        })
    }

    /// Tokens fed so far.
    #[wasm_bindgen(getter)]
    pub fn pos(&self) -> usize {
        self.session.pos()
    }

    /// Bytes of the arena (constant for the session's life).
    #[wasm_bindgen(getter, js_name = arenaLen)]
    pub fn arena_len(&self) -> usize {
        self.arena.len
    }

    /// Sets the sampler (fields of `settings`, each optional, the CLI's defaults
    /// otherwise: `temperature`, `topK`, `topP`, `minP`, `repeatPenalty`,
    /// `repeatWindow`, `seed`) and restarts its generator and look-back. Throws a
    /// `KvmError` for a value out of its range.
    #[wasm_bindgen(js_name = setSampler)]
    pub fn set_sampler(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "SamplerSettings | undefined")] settings: &JsValue,
    ) -> Result<(), JsValue> {
        let d = SamplerConfig::DEFAULT;
        let cfg = SamplerConfig {
            temperature: field(settings, "temperature", d.temperature.into())? as f32,
            top_k: small(field(settings, "topK", d.top_k.into())?, "topK")?,
            top_p: field(settings, "topP", d.top_p.into())? as f32,
            min_p: field(settings, "minP", d.min_p.into())? as f32,
            repeat_penalty: field(settings, "repeatPenalty", d.repeat_penalty.into())? as f32,
            repeat_window: small(field(settings, "repeatWindow", d.repeat_window.into())?, "repeatWindow")?,
        };
        // The ranges of `kvm generate`'s flags and the C API (one table, the core's), then
        // the sampler's own check, which has the last word.
        ranges::check(&cfg).map_err(|e| {
            let field = camel_case(e.field);
            kvm_error(&format!("sampler settings: {field} must be in {}", Shown::new(&e.range)))
        })?;
        cfg.validate().map_err(|e| kvm_error(&format!("sampler settings: {e}")))?;
        let seed = whole(field(settings, "seed", 0.0)?, "seed")?;
        self.recent = Recent::new(cfg.repeat_window).map_err(core_error)?;
        self.sampler = Sampler::new(cfg, seed);
        Ok(())
    }

    /// Feeds `tokens` (a prompt: `Model.tokenize`), calling `progress(done, total)` after
    /// every 64 tokens and at the end when given. Throws a `KvmError` for an empty
    /// prompt or a token out of range (the tokens before it are consumed).
    pub fn prefill(&mut self, tokens: &[u32], progress: Option<Function>) -> Result<(), JsValue> {
        if tokens.is_empty() {
            return Err(core_error(kvm_core::Error::InvalidArgument));
        }
        let mut done = 0;
        for piece in tokens.chunks(PROGRESS_TOKENS) {
            self.session.prefill(piece).map_err(core_error)?;
            done += piece.len();
            if let Some(f) = &progress {
                f.call2(&JsValue::NULL, &done.into(), &tokens.len().into())?;
            }
        }
        self.recent.push(tokens);
        Ok(())
    }

    /// Picks the next token, feeds it, and returns its text: `""` while a character's
    /// bytes are still incomplete, `undefined` at the end-of-text token (which is not
    /// fed; `finish()` then gives what an incomplete character held back). Invalid UTF-8
    /// comes out as U+FFFD, as `kvm generate` prints it. Throws a `KvmError` before any
    /// prompt.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<String>, JsValue> {
        // The core's logits are the position's after a prompt, a token or a restored state
        // that held them.
        if !self.session.has_logits() {
            return Err(kvm_error("no logits to sample from: prefill a prompt first"));
        }
        let tok = self.loaded.model.tokenizer();
        let next = self
            .sampler
            .sample(self.session.text_logits(), self.recent.tokens(), &mut self.scratch)
            .map_err(core_error)?;
        self.recent.push(&[next]);
        if Some(next) == tok.eos() {
            return Ok(None);
        }
        self.session.decode(next).map_err(core_error)?;
        let piece = self.decoder.push(&tok, next, &mut self.piece).map_err(core_error)?;
        Ok(Some(piece.to_owned()))
    }

    /// Ends a text made with `next()`: U+FFFD if it ended inside a character (as
    /// `kvm generate` ends it), else `""`.
    pub fn finish(&mut self) -> String {
        self.decoder.finish().to_owned()
    }

    /// Up to `max_tokens` calls of `next()`, then `finish()`, each piece of text also
    /// passed to `on_piece(piece)` when given; returns the text.
    pub fn generate(&mut self, max_tokens: u32, on_piece: Option<Function>) -> Result<String, JsValue> {
        let mut text = String::new();
        for _ in 0..max_tokens {
            let Some(piece) = self.next()? else { break };
            emit(&piece, on_piece.as_ref(), &mut text)?;
        }
        emit(&self.finish(), on_piece.as_ref(), &mut text)?;
        Ok(text)
    }

    /// A copy of the logits the next token is picked from, `[vocab_len]` (zeros before
    /// any prompt).
    pub fn logits(&self) -> Vec<f32> {
        self.session.logits().to_vec()
    }

    /// The session's state: the core's snapshot with the logits of the next pick after a
    /// prompt (FORMAT.md, "Session snapshots"), the state alone before any; CRC-checked.
    #[wasm_bindgen(js_name = saveState)]
    pub fn save_state(&self) -> Result<Vec<u8>, JsValue> {
        let mut out = try_vec(self.session.snapshot_as_is_len(), 0u8, "the saved state")?;
        self.session.snapshot_as_is(&mut out).map_err(core_error)?;
        Ok(out)
    }

    /// Takes back a `saveState()` of a session of the same model, or one of an earlier
    /// kvm-wasm (the core's state, then the logits and a CRC-32 of them); the sampler's
    /// look-back starts empty. Throws a `KvmError` (and changes nothing) for bytes that
    /// are not such a state.
    #[wasm_bindgen(js_name = restoreState)]
    pub fn restore_state(&mut self, state: &[u8]) -> Result<(), JsValue> {
        let snap = self.session.snapshot_len();
        let logits_len = self.session.snapshot_len_with_logits() - snap;
        let restored = match state.len() == snap + logits_len + 4 {
            true => self.restore_earlier(state, logits_len),
            false => self.session.restore(state),
        };
        restored.map_err(core_error)?;
        self.recent.clear();
        self.decoder = StreamDecoder::new();
        Ok(())
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("pos", &self.session.pos())
            .field("arena_len", &self.arena.len)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Restores a state of the earlier layout, `[snapshot_len + logits_len + 4]`: the
    /// core's state-only snapshot, the logits (zeros before any prompt) and their CRC-32;
    /// the logits are the position's once the state has a token (the counters' word 1,
    /// FORMAT.md).
    fn restore_earlier(&mut self, state: &[u8], logits_len: usize) -> Result<(), kvm_core::Error> {
        let (core, rest) = state.split_at(state.len() - logits_len - 4);
        let (logits, crc) = rest.split_at(logits_len);
        if crc != kvm_core::crc::crc32(logits).to_le_bytes() {
            return Err(kvm_core::Error::BadSnapshot);
        }
        match core.get(4..8).is_some_and(|pos| pos != [0; 4]) {
            true => self.session.restore_with_logits(core, logits),
            false => self.session.restore(core),
        }
    }
}

/// Appends `piece` to `text`, passing it to `on_piece` first when given (and not empty).
fn emit(piece: &str, on_piece: Option<&Function>, text: &mut String) -> Result<(), JsValue> {
    if let (Some(f), false) = (on_piece, piece.is_empty()) {
        f.call1(&JsValue::NULL, &JsValue::from_str(piece))?;
    }
    text.push_str(piece);
    Ok(())
}

/// `settings[name]` as a number, or `default` when it is absent.
fn field(settings: &JsValue, name: &str, default: f64) -> Result<f64, JsValue> {
    if settings.is_undefined() || settings.is_null() {
        return Ok(default);
    }
    let v = js_sys::Reflect::get(settings, &JsValue::from_str(name))?;
    if v.is_undefined() {
        return Ok(default);
    }
    v.as_f64().ok_or_else(|| kvm_error(&format!("sampler settings: {name} is not a number")))
}

/// `x` as a whole number `>= 0` that a double holds exactly.
fn whole(x: f64, name: &str) -> Result<u64, JsValue> {
    if x >= 0.0 && x.fract() == 0.0 && x <= 9_007_199_254_740_991.0 {
        Ok(x as u64)
    } else {
        Err(kvm_error(&format!("sampler settings: {name} must be a whole number >= 0, not {x}")))
    }
}

/// `x` as a whole number that fits a `u32`.
fn small(x: f64, name: &str) -> Result<u32, JsValue> {
    u32::try_from(whole(x, name)?).map_err(|_| kvm_error(&format!("sampler settings: {name} is too large: {x}")))
}

/// `top_p` as JavaScript spells the setting: `topP`.
fn camel_case(name: &str) -> String {
    let mut words = name.split('_');
    let mut out = String::from(words.next().unwrap_or_default());
    for w in words {
        let mut chars = w.chars();
        out.extend(chars.next().map(|c| c.to_ascii_uppercase()));
        out.push_str(chars.as_str());
    }
    out
}
