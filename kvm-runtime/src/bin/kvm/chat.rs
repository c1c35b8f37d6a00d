//! `kvm chat`: a conversation with one session for all of it. KVM's state is constant
//! size, so a chat of any length holds the same memory: the session, the sampler's scratch
//! and the few recent tokens its penalty reads.
//!
//! Each line read is a turn: `--user-prefix`, the line with its newline, then
//! `--assistant-prefix` are fed to the model, and the reply streams until `-n` tokens,
//! the end-of-text token, a `--stop` string or Ctrl-C (which ends only the reply). Lines
//! `/save FILE`, `/load FILE`, `/reset` and `/quit` are commands; end of input ends it.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use kvm_core::state::Phase;
use kvm_core::{Model, Session};
use kvm_runtime::pool::Pool;

use crate::prompt::{encode, prefill_with_progress};
use crate::reply::{End, Generator, Limits, SamplerArgs, TextOut};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    session: crate::SessionArgs,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Text fed once before the first turn (and again after /reset).
    #[arg(long, allow_hyphen_values = true)]
    system: Option<String>,
    /// Text fed before each line read.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    user_prefix: String,
    /// Text fed after each line read, before the reply.
    #[arg(long, allow_hyphen_values = true, default_value = "")]
    assistant_prefix: String,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "n-tokens", default_value_t = 256)]
    n: usize,
    /// End a reply where this string appears (not printed); repeatable.
    #[arg(long, allow_hyphen_values = true)]
    stop: Vec<String>,
    /// Never end a reply at the end-of-text token (it is never sampled).
    #[arg(long)]
    ignore_eos: bool,
    /// Write replies' exact bytes instead of replacing invalid UTF-8 with U+FFFD.
    #[arg(long)]
    raw: bool,
    /// Worker threads, in [1, 256] (default: all cores, at most 256).
    #[arg(long, value_parser = crate::flags::threads())]
    threads: Option<usize>,
}

/// True while a reply is being generated: Ctrl-C then ends the reply, not the program.
static REPLYING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during a reply; the decode loop checks it before every token.
static STOP: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_interrupt(_: libc::c_int) {
    if REPLYING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        // At the prompt Ctrl-C ends the program, as it would without this handler.
        // SAFETY: `signal` and `raise` are async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::raise(libc::SIGINT);
        }
    }
}

fn catch_interrupts() {
    #[cfg(unix)]
    // SAFETY: the handler only touches atomics and async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
}

pub fn run(a: &Args) -> Result<()> {
    let cfg = a.sampler.config()?;
    let file = a.session.model.open()?;
    let model = a.session.model(&file)?;
    let system = encode(&model, a.system.as_deref().unwrap_or("").as_bytes())?;
    let pool = Pool::new(crate::flags::threads_or_all(a.threads))?;
    let (mut arena, state_len) = a.session.arena(&model)?;
    let mut session = crate::session(model, &mut arena, state_len)?;
    let mut gen = Generator::new(model.tokenizer(), cfg, a.sampler.seed(), a.ignore_eos, &a.stop)?;
    let start = |session: &mut Session<'_, '_>, gen: &mut Generator<'_>| -> Result<()> {
        session.reset();
        gen.reset();
        if !system.is_empty() {
            prefill_with_progress(session, &system, Phase::Prefill, &pool)?;
            gen.saw(&system);
        }
        Ok(())
    };
    start(&mut session, &mut gen)?;
    catch_interrupts();

    let interactive = std::io::stdin().is_terminal();
    let mut input = std::io::stdin().lock();
    let (mut line, mut turn) = (Vec::new(), Vec::new());
    loop {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let said = line.strip_suffix(b"\n").unwrap_or(&line);
        let said = said.strip_suffix(b"\r").unwrap_or(said);
        match command(said) {
            Some(Command::Quit) => break,
            Some(Command::Reset) => {
                start(&mut session, &mut gen)?;
                eprintln!("(the conversation is forgotten)");
            }
            Some(Command::Save(path)) => save(&session, path, a),
            Some(Command::Load(path)) => load(&mut session, &mut gen, path),
            Some(Command::WithoutFile(word)) => eprintln!("kvm: error: {word} needs a file: {word} FILE"),
            None => {
                let Some(ids) = turn_ids(a, &model, said, &mut turn) else { continue };
                reply(a, &mut session, &mut gen, &pool, &ids)?;
            }
        }
    }
    Ok(())
}

/// `/save FILE`: the session's state to `FILE`; a failure is reported, not fatal.
fn save(session: &Session<'_, '_>, path: &Path, a: &Args) {
    match crate::snapshot::save(session, path, &[a.session.model.path()]) {
        Ok(()) => eprintln!("(saved to {})", path.display()),
        Err(e) => eprintln!("kvm: error: {e:#}"),
    }
}

/// `/load FILE`: the session's state from `FILE`; a failure is reported, not fatal.
fn load(session: &mut Session<'_, '_>, gen: &mut Generator<'_>, path: &Path) {
    match crate::snapshot::load(session, path) {
        Ok(()) => {
            gen.reset();
            eprintln!("(loaded {})", path.display());
        }
        // The session is as it was.
        Err(e) => eprintln!("kvm: error: {e:#}"),
    }
}

/// The ids of a turn: `--user-prefix`, the line said and its newline, `--assistant-prefix`
/// (built in `turn`); `None`, the error reported, if they do not encode.
fn turn_ids(a: &Args, model: &Model<'_>, said: &[u8], turn: &mut Vec<u8>) -> Option<Vec<u32>> {
    turn.clear();
    turn.extend_from_slice(a.user_prefix.as_bytes());
    turn.extend_from_slice(said);
    turn.push(b'\n');
    turn.extend_from_slice(a.assistant_prefix.as_bytes());
    match encode(model, turn) {
        Ok(ids) => Some(ids),
        Err(e) => {
            eprintln!("kvm: error: {e:#}");
            None
        }
    }
}

/// Feeds a turn's ids and streams the reply to stdout, until `-n` tokens, the end of text,
/// a stop string or Ctrl-C; the state then holds the whole reply.
fn reply(a: &Args, session: &mut Session<'_, '_>, gen: &mut Generator<'_>, pool: &Pool, ids: &[u32]) -> Result<()> {
    STOP.store(false, Ordering::SeqCst);
    REPLYING.store(true, Ordering::SeqCst);
    prefill_with_progress(session, ids, Phase::Prefill, pool)?;
    gen.saw(ids);
    let mut out = std::io::stdout().lock();
    let mut text_out = TextOut::new(a.raw);
    let limits = Limits { tokens: a.n, time: None, interrupt: Some(&STOP) };
    let mut write = |bytes: &[u8]| text_out.write(&mut out, bytes);
    let done = gen.reply(session, pool, &limits, &mut write, &mut |_, _| Ok(()))?;
    REPLYING.store(false, Ordering::SeqCst);
    // The state takes in the whole reply, so the next turn (or a /save) follows it.
    if let Some(last) = done.last {
        session.decode_with(last, pool)?;
    }
    text_out.finish(&mut out)?;
    writeln!(out)?;
    out.flush()?;
    if done.end == End::Interrupted {
        eprintln!("(stopped)");
    }
    Ok(())
}

enum Command<'l> {
    Save(&'l Path),
    Load(&'l Path),
    Reset,
    Quit,
    /// `/save` or `/load` without its file: a usage error, not words to the model.
    WithoutFile(&'l str),
}

/// The command `line` is, if it is one.
fn command(line: &[u8]) -> Option<Command<'_>> {
    let line = std::str::from_utf8(line).ok()?.trim();
    let (word, arg) = line.split_once(' ').map_or((line, ""), |(w, a)| (w, a.trim()));
    match (word, arg) {
        ("/reset", "") => Some(Command::Reset),
        ("/quit" | "/exit", "") => Some(Command::Quit),
        ("/save", f) if !f.is_empty() => Some(Command::Save(Path::new(f))),
        ("/load", f) if !f.is_empty() => Some(Command::Load(Path::new(f))),
        ("/save" | "/load", _) => Some(Command::WithoutFile(word)),
        _ => None,
    }
}
