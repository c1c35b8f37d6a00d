//! What generate and chat share: the sampler's flags, and the decode loop that samples a
//! reply and streams its bytes, ending it at a token budget, the end-of-text token, a
//! stop string, a time limit or an interrupt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kvm_core::sampler::{ranges, scratch_len, Candidate, Recent, Sampler, SamplerConfig};
use kvm_core::tokenizer::{StreamDecoder, Tokenizer};
use kvm_core::Session;
use kvm_runtime::arena::zeroed;
use kvm_runtime::pool::Pool;
use serde_json::{json, Value};

use crate::flags::ranged;

/// The sampler's settings, each parsed against its range (the C API's and kvm-wasm's,
/// [`ranges`]).
#[derive(Debug, clap::Args)]
pub struct SamplerArgs {
    /// Softmax temperature, in [0, 100]; 0 = greedy.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.temperature,
          value_parser = ranged(ranges::TEMPERATURE))]
    temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.top_k)]
    top_k: u32,
    /// Nucleus sampling, in (0, 1]; 1 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.top_p,
          value_parser = ranged(ranges::TOP_P))]
    top_p: f32,
    /// Keep tokens at least this likely relative to the most likely, in [0, 1]; 0 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.min_p,
          value_parser = ranged(ranges::MIN_P))]
    min_p: f32,
    /// Repetition penalty, in (0, 100]; 1 = off.
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.repeat_penalty,
          value_parser = ranged(ranges::REPEAT_PENALTY))]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over, in [0, 256] (as in the C API).
    #[arg(long, allow_negative_numbers = true, default_value_t = SamplerConfig::DEFAULT.repeat_window,
          value_parser = ranged(ranges::REPEAT_WINDOW))]
    repeat_window: u32,
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    seed: u64,
}

impl SamplerArgs {
    /// The settings, each checked against its range.
    pub fn config(&self) -> Result<SamplerConfig> {
        let c = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_window: self.repeat_window,
        };
        // The flags' ranges lie within the sampler's; its own validation has the last word.
        c.validate().context("sampler settings")?;
        Ok(c)
    }

    /// The random generator's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The settings as JSON, as `--json` echoes them.
    pub fn echo(&self) -> Value {
        // As typed (0.05, not the f32's 0.05000000074505806).
        let f = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::from(x));
        json!({
            "temperature": f(self.temperature),
            "top_k": self.top_k,
            "top_p": f(self.top_p),
            "min_p": f(self.min_p),
            "repeat_penalty": f(self.repeat_penalty),
            "repeat_window": self.repeat_window,
            "seed": self.seed,
        })
    }
}

/// How a reply ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It reached its token budget.
    Length,
    /// The model gave its end-of-text token.
    Eos,
    /// A stop string appeared (not printed).
    Stop,
    /// `--max-time` ran out.
    Time,
    /// Ctrl-C.
    Interrupted,
}

impl End {
    pub fn name(self) -> &'static str {
        match self {
            End::Length => "length",
            End::Eos => "eos",
            End::Stop => "stop",
            End::Time => "time",
            End::Interrupted => "interrupted",
        }
    }
}

/// The limits of one reply.
pub struct Limits<'f> {
    /// Tokens at most.
    pub tokens: usize,
    /// Wall time at most, from the first token on.
    pub time: Option<Duration>,
    /// Set (by a signal handler) to end the reply after the current token.
    pub interrupt: Option<&'f AtomicBool>,
}

/// What one reply did.
pub struct Outcome {
    pub end: End,
    /// Tokens sampled, an end-of-text token included.
    pub tokens: usize,
    /// The last token sampled, which the session has not been fed yet.
    pub last: Option<u32>,
}

/// A sampler with its scratch, the look-back of recent tokens its penalty reads (bounded,
/// so a long chat holds constant memory), and the stop strings.
pub struct Generator<'t> {
    tok: Tokenizer<'t>,
    sampler: Sampler,
    scratch: Vec<Candidate>,
    recent: Recent,
    /// The logits with the end-of-text token masked out, for `--ignore-eos`.
    masked: Vec<f32>,
    ignore_eos: bool,
    stops: StopFilter,
}

impl<'t> Generator<'t> {
    /// # Errors
    /// Out of memory for the sampler's buffers, which the vocabulary sizes; a
    /// `repeat_window` past [`ranges::MAX_REPEAT_WINDOW`] (which the flags refuse first).
    pub fn new(tok: Tokenizer<'t>, cfg: SamplerConfig, seed: u64, ignore_eos: bool, stops: &[String]) -> Result<Self> {
        let vocab = tok.vocab_len() as usize;
        Ok(Generator {
            tok,
            sampler: Sampler::new(cfg, seed),
            scratch: zeroed(scratch_len(vocab))?,
            recent: Recent::new(cfg.repeat_window)?,
            masked: zeroed(if ignore_eos { vocab } else { 0 })?,
            ignore_eos,
            stops: StopFilter::new(stops.iter().map(|s| s.as_bytes().to_vec()).collect()),
        })
    }

    /// Remembers `ids` as the most recent tokens (for the repetition penalty).
    pub fn saw(&mut self, ids: &[u32]) {
        self.recent.push(ids);
    }

    /// Forgets the recent tokens and any half-seen stop string.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.stops.pending.clear();
    }

    fn pick(&mut self, logits: &[f32]) -> Result<u32> {
        let logits = match (self.ignore_eos, self.tok.eos()) {
            (true, Some(eos)) => {
                let masked = &mut self.masked[..logits.len()];
                masked.copy_from_slice(logits);
                if let Some(l) = masked.get_mut(eos as usize) {
                    *l = f32::NEG_INFINITY;
                }
                masked
            }
            _ => logits,
        };
        Ok(self.sampler.sample(logits, self.recent.tokens(), &mut self.scratch)?)
    }

    /// Samples a reply from the logits in `session` (which must hold a token's), the ids
    /// with text only (never a padding id): each token's id and those logits
    /// ([`Session::text_logits`]) go to `seen` (all but an end-of-text token), the text's bytes
    /// to `out` as they are known not to begin a stop string.
    pub fn reply(
        &mut self,
        session: &mut Session<'_, '_>,
        pool: &Pool,
        limits: &Limits<'_>,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
        seen: &mut dyn FnMut(u32, &[f32]) -> Result<()>,
    ) -> Result<Outcome> {
        let t0 = Instant::now();
        let mut done = Outcome { end: End::Length, tokens: 0, last: None };
        let mut emit = Vec::new();
        while done.tokens < limits.tokens {
            if limits.interrupt.is_some_and(|f| f.load(Ordering::Relaxed)) {
                done.end = End::Interrupted;
                break;
            }
            if limits.time.is_some_and(|t| t0.elapsed() >= t) {
                done.end = End::Time;
                break;
            }
            if let Some(last) = done.last.take() {
                session.decode_with(last, pool)?;
            }
            let next = self.pick(session.text_logits())?;
            done.tokens += 1;
            done.last = Some(next);
            self.saw(&[next]);
            if Some(next) == self.tok.eos() && !self.ignore_eos {
                done.end = End::Eos;
                break;
            }
            seen(next, session.text_logits())?;
            emit.clear();
            let hit = self.stops.push(self.tok.token_bytes(next).unwrap_or(&[]), &mut emit);
            out(&emit)?;
            if hit {
                done.end = End::Stop;
                break;
            }
        }
        emit.clear();
        self.stops.finish(&mut emit);
        out(&emit)?;
        Ok(done)
    }
}

/// Holds back output that might be the start of a stop string until it is known not to
/// be, and finds stop strings that span tokens.
struct StopFilter {
    stops: Vec<Vec<u8>>,
    /// Bytes not yet written: a proper prefix of some stop string.
    pending: Vec<u8>,
}

impl StopFilter {
    fn new(stops: Vec<Vec<u8>>) -> Self {
        StopFilter { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: Vec::new() }
    }

    /// Takes a token's bytes; appends to `out` what is safe to write. True when a stop
    /// string is complete: `out` then ends just before it and the rest is dropped.
    fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> bool {
        self.pending.extend_from_slice(bytes);
        let first = self.stops.iter().filter_map(|s| find(&self.pending, s)).min();
        if let Some(at) = first {
            out.extend_from_slice(&self.pending[..at]);
            self.pending.clear();
            return true;
        }
        // The longest end of `pending` that a stop string starts with: everything before
        // it can no longer be part of a stop string.
        let held = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.pending.len() + 1)).rev().find(|&k| self.pending.ends_with(&s[..k])).unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let free = self.pending.len() - held;
        out.extend(self.pending.drain(..free));
        false
    }

    /// The reply is over without a stop: what was held back is text after all.
    fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.pending);
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Generated bytes on their way to a writer: as they are (`--raw`) or as text, each
/// invalid UTF-8 sequence a U+FFFD (the core's [`StreamDecoder`], as
/// `String::from_utf8_lossy` of the whole text would have it).
pub struct TextOut {
    raw: bool,
    stream: StreamDecoder,
    text: Vec<u8>,
}

impl TextOut {
    pub fn new(raw: bool) -> TextOut {
        TextOut { raw, stream: StreamDecoder::new(), text: Vec::new() }
    }

    /// Writes `bytes` to `out` and flushes it.
    pub fn write(&mut self, out: &mut impl std::io::Write, bytes: &[u8]) -> Result<()> {
        if self.raw {
            out.write_all(bytes)?;
        } else {
            // Every byte could end an open sequence and be a U+FFFD of its own.
            self.text.resize(3 * (bytes.len() + 3), 0);
            let text = self.stream.push_bytes(bytes, &mut self.text)?;
            out.write_all(text.as_bytes())?;
        }
        Ok(out.flush()?)
    }

    /// Writes what an incomplete final sequence held back (as text; nothing when raw).
    pub fn finish(&mut self, out: &mut impl std::io::Write) -> Result<()> {
        if !self.raw {
            out.write_all(self.stream.finish().as_bytes())?;
        }
        Ok(())
    }
}

/// A token's log-probability under the model (softmax of the raw logits, before the
/// sampler's temperature and filters) and the `n` most likely tokens', most likely first.
pub fn logprobs(logits: &[f32], id: u32, n: usize) -> (f64, Vec<(u32, f64)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits.iter().map(|&z| (z as f64 - max).exp()).sum::<f64>().ln() + max;
    let lp = |i: u32| logits.get(i as usize).map_or(f64::NEG_INFINITY, |&z| z as f64 - log_sum);
    let mut top: Vec<u32> = Vec::with_capacity(n + 1);
    for i in 0..logits.len() as u32 {
        // Ties keep the lower id first, as the greedy pick does.
        let at = top.partition_point(|&t| logits[t as usize] >= logits[i as usize]);
        if at < n {
            top.insert(at, i);
            top.truncate(n);
        }
    }
    (lp(id), top.into_iter().map(|t| (t, lp(t))).collect())
}

#[cfg(test)]
mod tests {
    use super::{logprobs, StopFilter, TextOut};

    /// Feeds `pieces` through a filter for `stops`: the text written, and whether it stopped.
    fn filter(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.as_bytes().to_vec()).collect());
        let mut out = Vec::new();
        for p in pieces {
            if f.push(p.as_bytes(), &mut out) {
                return (String::from_utf8(out).unwrap(), true);
            }
        }
        f.finish(&mut out);
        (String::from_utf8(out).unwrap(), false)
    }

    #[test]
    fn stop_strings_spanning_tokens_are_found_and_never_printed() {
        assert_eq!(filter(&["END"], &["ab", "cE", "N", "Dxy"]), ("abc".into(), true));
        assert_eq!(filter(&["END"], &["aEN", "x", "END"]), ("aENx".into(), true));
        assert_eq!(filter(&["END", "b"], &["aENDb"]), ("a".into(), true));
        assert_eq!(filter(&["END", "b"], &["abEND"]), ("a".into(), true));
        assert_eq!(filter(&["END"], &["aE", "N"]), ("aEN".into(), false));
        assert_eq!(filter(&[""], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn a_possible_stop_is_held_back_until_resolved() {
        let mut f = StopFilter::new(vec![b"\nUser:".to_vec()]);
        let mut out = Vec::new();
        assert!(!f.push(b"Hi\nUs", &mut out));
        assert_eq!(out, b"Hi");
        assert!(!f.push(b"ually", &mut out));
        assert_eq!(out, b"Hi\nUsually");
    }

    #[test]
    fn utf8_split_between_pieces_waits_and_bad_bytes_become_replacements() {
        let mut s = TextOut::new(false);
        let mut out = Vec::new();
        for piece in [&b"a\xc3"[..], b"\xa9b\xff", b"\xe2\x82"] {
            s.write(&mut out, piece).unwrap();
        }
        assert_eq!(out, "a\u{e9}b\u{fffd}".as_bytes());
        s.finish(&mut out).unwrap();
        assert_eq!(out, "a\u{e9}b\u{fffd}\u{fffd}".as_bytes());
        assert_eq!(out, String::from_utf8_lossy(b"a\xc3\xa9b\xff\xe2\x82").as_bytes());
    }

    #[test]
    fn logprobs_are_normalised_and_the_top_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let (lp, top) = logprobs(&logits, 2, 3);
        let total: f64 = logits.iter().map(|&z| (z as f64 - 3.0).exp()).sum::<f64>();
        assert!((lp - (2.0 - 3.0 - total.ln())).abs() < 1e-12);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        assert!(top[0].1 == top[1].1 && top[1].1 > top[2].1 && top[0].1 < 0.0);
    }
}
