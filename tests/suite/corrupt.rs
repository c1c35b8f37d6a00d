//! Malformed input never panics and is never accepted: truncations, flipped bits,
//! version and config tampering, bad arenas, out-of-range tokens.

use crate::common::*;
use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::error::{ConfigField, Error, Section, Unsupported};
use kvm_core::format::{Header, TensorEntry, ENTRY_LEN, HEADER_LEN};
use kvm_core::quant::DType;
use kvm_core::{Model, Session};
use kvm_write::policy::Policy;

fn fixed_basic() -> Vec<u8> {
    convert_to_bytes(&golden_dir("fixed_basic"), DType::F32)
}

/// Rewrites the header through `edit`, with a valid header CRC.
fn with_header(blob: &[u8], edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut h = Header::parse(blob).unwrap();
    edit(&mut h);
    let mut out = blob.to_vec();
    let mut head = [0u8; HEADER_LEN];
    h.encode(&mut head);
    out[..HEADER_LEN].copy_from_slice(&head);
    out
}

#[test]
fn every_truncation_is_refused() {
    let blob = fixed_basic();
    assert!(Model::from_bytes(&blob).is_ok());
    let cuts = (0..4096).chain((4096..blob.len()).step_by(331)).chain([blob.len() - 1]);
    for cut in cuts {
        assert!(Model::from_bytes(&blob[..cut]).is_err(), "truncated at {cut} accepted");
        assert!(Model::from_bytes_trusted(&blob[..cut]).is_err(), "truncated at {cut} accepted (trusted)");
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert!(Model::from_bytes(&longer).is_err(), "trailing byte accepted");
}

#[test]
fn every_flipped_bit_is_refused() {
    let blob = fixed_basic();
    // Every byte of header, table and the first tensors; a stride through the rest
    // (tensor data and padding alike).
    let positions = (0..8192).chain((8192..blob.len()).step_by(97));
    for pos in positions {
        let mut bad = blob.clone();
        bad[pos] ^= 1 << (pos % 8);
        match Model::from_bytes(&bad) {
            Ok(_) => panic!("flipped bit at byte {pos} accepted"),
            Err(e) if pos >= 8192 => {
                assert!(matches!(e, Error::Checksum { .. }), "byte {pos}: expected a checksum error, got {e:?}")
            }
            Err(_) => {}
        }
    }
}

#[test]
fn flips_name_the_damaged_section() {
    let blob = fixed_basic();
    let h = Header::parse(&blob).unwrap();
    let flip = |pos: usize| {
        let mut bad = blob.clone();
        bad[pos] ^= 0x10;
        Model::from_bytes(&bad).unwrap_err()
    };
    assert_eq!(flip(200), Error::Checksum { section: Section::Header });
    assert_eq!(flip(h.table_offset as usize + 5), Error::Checksum { section: Section::TensorTable });
    let first = Model::from_bytes(&blob).unwrap().tensors().next().unwrap();
    assert_eq!(flip(first.offset as usize + 3), Error::Checksum { section: Section::Tensor { index: 0 } });
    let padded = Model::from_bytes(&blob).unwrap().tensors().find(|t| t.len % 64 != 0).unwrap();
    assert_eq!(flip(padded.offset as usize + padded.len as usize + 1), Error::Checksum { section: Section::Padding });
    // The trusted loader skips data checksums but still checks structure.
    let mut bad = blob.clone();
    bad[first.offset as usize + 3] ^= 0x10;
    assert!(Model::from_bytes_trusted(&bad).is_ok());
}

#[test]
fn random_garbage_is_refused() {
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let blob = fixed_basic();
    for len in [0usize, 1, 4, 16, 255, 256, 257, 1000, 4096, 70_000] {
        let garbage: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        assert!(Model::from_bytes(&garbage).is_err());
        // A valid magic and version on garbage.
        let mut g = garbage.clone();
        if g.len() >= 8 {
            g[..8].copy_from_slice(&blob[..8]);
            assert!(Model::from_bytes(&g).is_err());
        }
    }
    // Random bytes written over a valid header: the header CRC refuses them.
    for _ in 0..2000 {
        let mut bad = blob.clone();
        let pos = 20 + (next() as usize % (HEADER_LEN - 20));
        bad[pos] = blob[pos] ^ (1 + (next() % 255) as u8);
        assert!(Model::from_bytes(&bad).is_err(), "random header byte at {pos} accepted");
    }
}

#[test]
fn versions_and_byte_order() {
    let blob = fixed_basic();
    let mut major = blob.clone();
    major[4] = 2;
    assert_eq!(
        Model::from_bytes(&major).unwrap_err(),
        Error::UnsupportedVersion { major: 2, minor: kvm_core::format::VERSION_MINOR }
    );
    // A newer minor version is read.
    let newer = with_header(&blob, |h| h.minor = 7);
    assert_eq!(Model::from_bytes(&newer).unwrap().header().minor, 7);
    let mut swapped = blob.clone();
    swapped[8..12].reverse();
    assert_eq!(Model::from_bytes(&swapped).unwrap_err(), Error::BadEndianness);
    let mut magic = blob.clone();
    magic[0] = b'X';
    assert_eq!(Model::from_bytes(&magic).unwrap_err(), Error::BadMagic);
}

#[test]
fn unsupported_and_invalid_configs_are_refused() {
    use kvm_core::config::{flags, StateBudget};
    let blob = fixed_basic();
    let no_vlens_growable = with_header(&blob, |h| {
        h.config.flags &= !flags::VLENS;
        h.config.budget = StateBudget::PowerLaw { factor: 2.0, exponent: 0.5 };
    });
    assert_eq!(Model::from_bytes(&no_vlens_growable).unwrap_err(), Error::Unsupported(Unsupported::NoVlensShape));
    for edit in [
        (|h: &mut Header| h.config.rope_dim = 3) as fn(&mut Header),
        |h| h.config.rope_dim = 64,
        |h| h.config.chunk_len = 0,
        |h| h.config.n_heads = 0,
        |h| h.config.sink_len = 8,
        |h| h.config.flags |= 1 << 20,
        |h| h.config.residual_scale = f32::NAN,
        // The reference reads `residual_scale or 1.0`: 0 would mean 1 to it.
        |h| h.config.residual_scale = 0.0,
        |h| h.config.residual_scale = -0.0,
        |h| h.config.vocab_len = 97,
        |h| h.config.d_model = 65,
        |h| h.state_capacity = 4,
        |h| h.n_tensors -= 1,
        |h| h.table_offset += 48,
        |h| h.tokenizer_len = 1,
        |h| h.file_len = u64::MAX,
        |h| h.table_len = u64::MAX - 10,
    ] {
        let bad = with_header(&blob, edit);
        assert!(Model::from_bytes(&bad).is_err(), "edited header accepted: {:?}", Header::parse(&bad));
    }
}

/// `hybrid_swa_saturation` as f32: 4 layers, alternate (`swa`) layers 0 and 2.
fn hybrid() -> Vec<u8> {
    convert_to_bytes(&golden_dir("hybrid_swa_saturation"), DType::F32)
}

/// `blob` with its tensor table rebuilt by `edit` (every entry with its data, in file
/// order, to relabel, insert or drop) and the file laid out again around it: offsets,
/// lengths, `n_tensors` and every checksum made right, so only the table's agreement
/// with the config stands between the file and a session.
fn with_tensors(blob: &[u8], edit: impl FnOnce(&mut Vec<(TensorEntry, Vec<u8>)>)) -> Vec<u8> {
    use kvm_core::format::{crc32, TENSOR_ALIGN};
    let h = Header::parse(blob).unwrap();
    let table = &blob[h.table_offset as usize..][..h.table_len as usize];
    let mut tensors: Vec<(TensorEntry, Vec<u8>)> = table
        .chunks_exact(ENTRY_LEN)
        .map(|raw| {
            let e = TensorEntry::parse(raw).unwrap();
            (e, blob[e.offset as usize..][..e.len as usize].to_vec())
        })
        .collect();
    edit(&mut tensors);
    let tokenizer = &blob[h.tokenizer_offset as usize..][..h.tokenizer_len as usize];
    let tokenizer_offset = HEADER_LEN + tensors.len() * ENTRY_LEN;
    let mut out = vec![0u8; tokenizer_offset];
    out.extend_from_slice(tokenizer);
    let mut table = Vec::new();
    for (e, data) in &tensors {
        out.resize(out.len().next_multiple_of(TENSOR_ALIGN), 0);
        let e = TensorEntry { offset: out.len() as u64, len: data.len() as u64, crc: crc32(data), ..*e };
        table.extend_from_slice(&e.encode());
        out.extend_from_slice(data);
    }
    out.resize(out.len().next_multiple_of(TENSOR_ALIGN), 0);
    out[HEADER_LEN..tokenizer_offset].copy_from_slice(&table);
    let h = Header {
        n_tensors: tensors.len() as u32,
        table_offset: HEADER_LEN as u64,
        table_len: table.len() as u64,
        table_crc: crc32(&table),
        tokenizer_offset: tokenizer_offset as u64,
        file_len: out.len() as u64,
        ..h
    };
    let mut head = [0u8; HEADER_LEN];
    h.encode(&mut head);
    out[..HEADER_LEN].copy_from_slice(&head);
    out
}

#[test]
fn hybrid_fields_are_checked_and_each_layer_kind_has_its_own_tensors() {
    let blob = hybrid();
    assert!(Model::from_bytes(&blob).is_ok());
    for (edit, field) in [
        ((|h: &mut Header| h.config.alt_window = 0) as fn(&mut Header), ConfigField::AltWindow),
        (|h| h.config.alt_layer_every = 1, ConfigField::AltLayerEvery),
        (|h| h.config.alt_rope_dim = 3, ConfigField::AltRopePartialDim),
        (|h| h.config.alt_rope_dim = 34, ConfigField::AltRopePartialDim),
        (|h| h.config.alt_rope_theta = f64::NAN, ConfigField::AltRopeTheta),
        (|h| h.config.alt_rope_theta = 0.0, ConfigField::AltRopeTheta),
    ] {
        let bad = with_header(&blob, edit);
        assert_eq!(Model::from_bytes(&bad).unwrap_err(), Error::BadConfig(field));
    }
    // A hybrid's alternate layers lack the KVM-only tensors: read as all-KVM, its table
    // is short of them; and an all-KVM file read as a hybrid has them on its alternate
    // layers. Both refused by the tensor table's check.
    let all_kvm = with_header(&blob, |h| {
        let c = &mut h.config;
        (c.alt_layer_every, c.alt_window, c.alt_rope_dim, c.alt_rope_theta) = (0, 0, 0, 0.0);
    });
    assert!(matches!(Model::from_bytes(&all_kvm).unwrap_err(), Error::BadTensor { .. }));
    let as_hybrid = with_header(&fixed_basic(), |h| {
        let c = &mut h.config;
        (c.alt_layer_every, c.alt_window, c.alt_rope_dim, c.alt_rope_theta) = (2, 8, 16, 1e4);
    });
    assert!(matches!(Model::from_bytes(&as_hybrid).unwrap_err(), Error::BadTensor { .. }));
    // Old files (minor 5 and before) hold zeros there: no alternate layers.
    let old = with_header(&fixed_basic(), |h| h.minor = 5);
    assert!(!Model::from_bytes(&old).unwrap().config().is_hybrid());
}

/// The layer kinds the header states (layer `i` is an alternate layer iff `i %
/// alt_layer_every == 0`) and the tensor table tell one story, entry by entry: a table
/// that disagrees is refused, even with its count, offsets and checksums made right, at
/// the first entry that is not the one the config expects there (named by that role and
/// layer), by both loaders.
#[test]
fn a_tensor_table_that_disagrees_with_the_layer_kinds_is_refused() {
    use kvm_core::format::Role;
    let blob = hybrid();
    assert_eq!(with_tensors(&blob, |_| {}), blob, "laid out again as the writer lays it");
    let refused = |bad: &[u8], want: Error| {
        assert_eq!(Model::from_bytes(bad).unwrap_err(), want);
        assert_eq!(Model::from_bytes_trusted(bad).unwrap_err(), want);
    };
    let at = |role: Role, layer: u16| Error::BadTensor { role: role as u16, layer };
    let count = Error::BadTensor { role: u16::MAX, layer: u16::MAX };
    // Every third layer from 0: layers 0 and 3, as many tensors as layers 0 and 2 have,
    // but layer 2, a KVM layer then, has no ln_s_k after its ln_k.
    refused(&with_header(&blob, |h| h.config.alt_layer_every = 3), at(Role::LnSkW, 2));
    // Every fourth: layer 0 alone, a table short of layer 2's KVM-only tensors.
    refused(&with_header(&blob, |h| h.config.alt_layer_every = 4), count);
    // The KVM-only tensors of KVM layer 1 moved onto alternate layer 0, in role order:
    // the count holds, layer 0's c_proj is not where its ln_k's successor should be.
    let kvm_only = |t: &[(TensorEntry, Vec<u8>)], layer: u16| -> Vec<usize> {
        (0..t.len()).filter(|&i| t[i].0.layer == layer && t[i].0.role.is_kvm_only()).collect()
    };
    let onto_layer_0 = |t: &mut Vec<(TensorEntry, Vec<u8>)>, keep_layer_1: bool| {
        let from = kvm_only(t, 1);
        assert_eq!(from.len(), 5, "ln_s_k weight and bias, key_weighting, two head temperatures");
        assert!(kvm_only(t, 0).is_empty());
        let moved: Vec<_> = from.iter().map(|&i| (TensorEntry { layer: 0, ..t[i].0 }, t[i].1.clone())).collect();
        if !keep_layer_1 {
            from.iter().rev().for_each(|&i| drop(t.remove(i)));
        }
        let wo = t.iter().position(|(e, _)| (e.role, e.layer) == (Role::Wo, 0)).unwrap();
        t.splice(wo..wo, moved);
    };
    refused(&with_tensors(&blob, |t| onto_layer_0(t, false)), at(Role::Wo, 0));
    // Copied instead: five tensors more than the config has.
    refused(&with_tensors(&blob, |t| onto_layer_0(t, true)), count);
    // An alternate layer's ln_k relabelled as the KVM-only ln_s_k, of the same shape.
    let relabelled = with_tensors(&blob, |t| {
        let ln_k = t.iter_mut().find(|(e, _)| (e.role, e.layer) == (Role::LnKW, 2)).unwrap();
        ln_k.0.role = Role::LnSkW;
    });
    refused(&relabelled, at(Role::LnKW, 2));
    // A KVM layer without one of its KVM-only tensors: a table short of it.
    let dropped = with_tensors(&blob, |t| t.retain(|(e, _)| (e.role, e.layer) != (Role::StateTemp, 3)));
    refused(&dropped, count);
}

/// A growable file's room is its state capacity, from one chunk (the first chunk always
/// enters the state whole) to the `max_state_chunks` chunks its config allows. A
/// capacity of 0, or more than the config allows, is refused; a config with room for 0
/// chunks (the reference's `n_max_d_chunks` 0, which never lets the state grow past its
/// first chunk) holds that chunk and runs as a room of one chunk does.
#[test]
fn a_growable_file_whose_room_is_0_is_refused_or_keeps_its_first_chunk() {
    let capacity = Error::BadConfig(ConfigField::StateCapacity);
    for case in ["growable_power_law", "hybrid_swa_saturation"] {
        let blob = convert_to_bytes(&golden_dir(case), DType::F32);
        let h = Header::parse(&blob).unwrap();
        assert!(h.state_capacity > h.config.chunk_len, "{case}: a room of more than one chunk");
        assert_eq!(Model::from_bytes(&with_header(&blob, |h| h.state_capacity = 0)).unwrap_err(), capacity);
        let no_room = with_header(&blob, |h| h.config.max_state_chunks = 0);
        assert_eq!(Model::from_bytes(&no_room).unwrap_err(), capacity, "{case}: the file's capacity past its room");
        let room = |chunks: u32| {
            with_header(&blob, |h| {
                h.config.max_state_chunks = chunks;
                h.state_capacity = h.config.chunk_len;
            })
        };
        let (none, one) = (room(0), room(1));
        let run = |bytes: &[u8]| {
            let model = Model::from_bytes(bytes).unwrap();
            assert!(model.arena_len_for(model.config().chunk_len as usize + 1).is_err());
            let mut arena = Arena::new(model.arena_len());
            let mut session = Session::new(model, arena.bytes_mut()).unwrap();
            session.prefill(&[3, 1, 4, 1, 5]).unwrap();
            (0..100).flat_map(|i| session.decode(i * 37 % 96).unwrap().to_vec()).collect::<Vec<f32>>()
        };
        assert_eq!(run(&none), run(&one), "{case}: a room of 0 chunks runs as one of 1");
    }
}

#[test]
fn the_cache_dtype_is_read_from_the_header_and_unknown_ones_are_refused() {
    let blob = fixed_basic();
    let f32m = Model::from_bytes(&blob).unwrap();
    assert_eq!(f32m.cache(), CacheDtype::F32);
    let half_blob = with_header(&blob, |h| h.cache = CacheDtype::F16);
    let half = Model::from_bytes(&half_blob).unwrap();
    assert_eq!(half.cache(), CacheDtype::F16);
    assert_eq!(half.arena_len(), f32m.with_cache(CacheDtype::F16).unwrap().arena_len());
    assert!(half.arena_len() < f32m.arena_len());
    // An f32 session's snapshot does not restore into an f16 session (other layout).
    let (mut a1, mut a2) = (Arena::new(f32m.arena_len()), Arena::new(half.arena_len()));
    let mut s1 = Session::new(f32m, a1.bytes_mut()).unwrap();
    s1.prefill(&[1, 2, 3]).unwrap();
    let mut snap = vec![0u8; s1.snapshot_len()];
    s1.snapshot(&mut snap).unwrap();
    assert_eq!(Session::new(half, a2.bytes_mut()).unwrap().restore(&snap).unwrap_err(), Error::BadSnapshot);
    // A tag no build knows, with a valid header CRC.
    let mut bad = blob.clone();
    bad[92..96].copy_from_slice(&7u32.to_le_bytes());
    bad[16..20].copy_from_slice(&0u32.to_le_bytes());
    let crc = kvm_core::format::crc32(&bad[..HEADER_LEN]);
    bad[16..20].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(Model::from_bytes(&bad).unwrap_err(), Error::BadConfig(ConfigField::CacheDtype));
    // Likewise the slot reads (offset 208), whose 1 is recomputed reads.
    for (tag, want) in [(1u32, Ok(SlotReads::Recomputed)), (2, Err(Error::BadConfig(ConfigField::SlotReads)))] {
        let mut bad = blob.clone();
        bad[208..212].copy_from_slice(&tag.to_le_bytes());
        bad[16..20].copy_from_slice(&0u32.to_le_bytes());
        let crc = kvm_core::format::crc32(&bad[..HEADER_LEN]);
        bad[16..20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Model::from_bytes(&bad).map(|m| m.slot_reads()), want);
    }
}

/// An integer file keeps attention rows as i16 (`f32` in the header) or i8 (`q8`): an f16
/// cache in its header is refused by the parser and by `with_cache`, and a q8 one sizes
/// the arena for i8 rows.
#[test]
fn an_integer_file_takes_i16_or_i8_rows_and_refuses_f16() {
    let blob = convert_with(&golden_dir("fixed_basic"), &Policy::int());
    let int = Model::from_bytes(&blob).unwrap();
    let half = with_header(&blob, |h| h.cache = CacheDtype::F16);
    assert_eq!(Model::from_bytes(&half).unwrap_err(), Error::BadConfig(ConfigField::CacheDtype));
    assert_eq!(int.with_cache(CacheDtype::F16).unwrap_err(), Error::BadConfig(ConfigField::CacheDtype));
    let q8_blob = with_header(&blob, |h| h.cache = CacheDtype::Q8);
    let q8 = Model::from_bytes(&q8_blob).unwrap();
    assert!(q8.arena_len() < int.arena_len());
    assert_eq!(q8.arena_len(), int.with_cache(CacheDtype::Q8).unwrap().arena_len());
}

#[test]
fn parameters_of_another_state_budget_must_be_zero() {
    // Offsets of the growth factor, the growth exponent and the saturation n (FORMAT.md).
    let (factor, exponent, saturation) = (184, 192, 200);
    let fixed = fixed_basic();
    let power_law = convert_to_bytes(&golden_dir("growable_power_law"), DType::F32);
    let (growth, sat) =
        (Err(Error::BadConfig(ConfigField::StateGrowth)), Err(Error::BadConfig(ConfigField::StateSaturation)));
    for (blob, at, want) in
        [(&fixed, factor, growth), (&fixed, exponent, growth), (&fixed, saturation, sat), (&power_law, saturation, sat)]
    {
        for v in [f64::NAN, 1.0, -0.5, f64::INFINITY] {
            let mut bad = blob.clone();
            bad[at..at + 8].copy_from_slice(&v.to_le_bytes());
            bad[16..20].copy_from_slice(&0u32.to_le_bytes());
            let crc = kvm_core::format::crc32(&bad[..HEADER_LEN]);
            bad[16..20].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(Model::from_bytes(&bad).map(|_| ()), want, "{v} at offset {at}");
        }
    }
    assert!(Model::from_bytes(&fixed).is_ok() && Model::from_bytes(&power_law).is_ok());
}

/// An interleaved tensor must hold whole groups of 16 rows: relabelling a row-major one
/// (same bytes, valid checksums) that does not is refused, one that does is accepted.
#[test]
fn interleaved_tensors_must_hold_whole_row_groups() {
    for plain in [DType::Q4_0, DType::Q8_0] {
        relabelled_row_major(plain);
    }
}

/// [`interleaved_tensors_must_hold_whole_row_groups`] for `plain` tensors.
fn relabelled_row_major(plain: DType) {
    let policy = Policy { repack: false, ..Policy::uniform(plain) };
    let blob = convert_with(&golden_dir("fixed_basic"), &policy);
    let h = Header::parse(&blob).unwrap();
    let relabel = |pick: &dyn Fn(&TensorEntry) -> bool| {
        let model = Model::from_bytes(&blob).unwrap();
        let i = model.tensors().position(|e| e.dtype == plain && pick(&e)).expect("a tensor of that shape");
        let e = model.tensors().nth(i).unwrap();
        let mut out = blob.clone();
        let at = h.table_offset as usize + i * ENTRY_LEN;
        let dtype = plain.interleaved().unwrap();
        out[at..at + ENTRY_LEN].copy_from_slice(&TensorEntry { dtype, ..e }.encode());
        let table = &out[h.table_offset as usize..][..h.table_len as usize];
        let crc = kvm_core::format::crc32(table);
        (with_header(&out, |h| h.table_crc = crc), e)
    };
    let (bad, e) = relabel(&|e| e.rows % 16 != 0);
    assert_eq!(Model::from_bytes(&bad).unwrap_err(), Error::BadTensor { role: e.role as u16, layer: e.layer });
    let (good, _) = relabel(&|e| e.rows % 16 == 0);
    assert!(Model::from_bytes(&good).is_ok());
}

#[test]
fn sessions_refuse_bad_arenas_and_tokens() {
    let blob = fixed_basic();
    let model = Model::from_bytes(&blob).unwrap();
    let len = model.arena_len();
    for wrong in [0, len - 1, len + 1, len - 64] {
        let mut arena = Arena::new(wrong);
        assert_eq!(Session::new(model, arena.bytes_mut()).unwrap_err(), Error::ArenaSize { expected: len, got: wrong });
    }
    let mut big = Arena::new(len + 4);
    assert_eq!(Session::new(model, &mut big.bytes_mut()[4..]).unwrap_err(), Error::ArenaMisaligned);
    let mut arena = Arena::new(len);
    let mut session = Session::new(model, arena.bytes_mut()).unwrap();
    assert_eq!(session.decode(96).unwrap_err(), Error::TokenOutOfRange { token: 96, vocab_len: 96 });
    assert_eq!(session.prefill(&[]).unwrap_err(), Error::InvalidArgument);
    assert_eq!(session.pos(), 0, "a refused token consumes nothing");
    session.decode(95).unwrap();
    assert_eq!(session.pos(), 1);
    // Capacities outside [chunk_len, natural] are refused.
    assert!(model.arena_len_for(7).is_err());
    assert!(model.arena_len_for(9).is_err());
}

#[test]
fn export_refuses_unsupported_checkpoints() {
    let src = golden_dir("fixed_basic");
    let tmp = std::env::temp_dir().join(format!("kvm-unsupported-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(src.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for (field, value, needle) in [
        ("use_skip_connections", serde_json::json!(1), "use_skip_connections"),
        ("use_block_lambdas", serde_json::json!(1), "use_block_lambdas"),
        ("alt_layer_every", serde_json::json!(1), "alt_layer_every"),
        // A hybrid whose alternate layers' RoPE (the default, 64 dims) is wider than d_qk.
        ("alt_layer_every", serde_json::json!(2), "alt_rope_partial_dim"),
        ("token_mixer", serde_json::json!("swa"), "token_mixer"),
        ("kvm_value_residual_mode", serde_json::json!("linear"), "kvm_value_residual_mode"),
        ("rope_partial_dim", serde_json::json!(15), "rope_partial_dim"),
        ("hidden_size", serde_json::json!(128), "transformer"),
    ] {
        let mut cfg = base.clone();
        cfg[field] = value;
        std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
        let policy = kvm_write::policy::Policy::uniform(DType::F32);
        let err = kvm_export::convert::convert(
            &tmp,
            &tmp.join("out.kvm"),
            &policy,
            &kvm_export::convert::TokenizerSource::Bytes,
            &mut |_| {},
        )
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{field}: error `{msg}` does not name `{needle}`");
    }
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn snapshots_restore_exactly_and_forged_ones_are_refused() {
    let blob = convert_to_bytes(&golden_dir("growable_power_law"), DType::F32);
    let model = Model::from_bytes(&blob).unwrap();
    let (mut a1, mut a2) = (Arena::new(model.arena_len()), Arena::new(model.arena_len()));
    let mut a3 = Arena::new(model.arena_len());
    let mut s1 = Session::new(model, a1.bytes_mut()).unwrap();
    let ids: Vec<u32> = (0..150).map(|i| (i * 13 % 96) as u32).collect();
    s1.prefill(&ids[..70]).unwrap();
    let mut snap = vec![0u8; s1.snapshot_len()];
    s1.snapshot(&mut snap).unwrap();
    let mut s2 = Session::new(model, a2.bytes_mut()).unwrap();
    s2.restore(&snap).unwrap();
    for &t in &ids[70..] {
        let l1 = s1.decode(t).unwrap().to_vec();
        assert_eq!(l1, s2.decode(t).unwrap(), "restored session diverged");
    }
    // Counters no session can reach are refused, as are foreign lengths, even with the
    // CRC made right for them (words: 1 pos, 2 slots, 3 coverage).
    let forged = [
        vec![(1usize, 5u32), (2, 0)],
        vec![(2, 10_000)],
        vec![(3, 1_000)],
        vec![(1, 1_000_000)],
        vec![(1, 1 << 31)],
        vec![(3, 0)],
        vec![(2, 3)],
        vec![(1, 20), (2, 20), (3, 20)],
    ];
    for words in forged {
        let mut bad = snap.clone();
        for &(word, value) in &words {
            bad[word * 4..word * 4 + 4].copy_from_slice(&value.to_le_bytes());
        }
        assert_eq!(s2.restore(&bad).unwrap_err(), Error::BadSnapshot, "{words:?}, its CRC as saved");
        set_snapshot_crc(&mut bad);
        assert_eq!(s2.restore(&bad).unwrap_err(), Error::BadSnapshot, "{words:?}, its CRC made right");
    }
    // A real session's counters at another position pass the counters' checks: only the
    // CRC stands between it and a silently different state.
    let mut early = vec![0u8; snap.len()];
    let mut s3 = Session::new(model, a3.bytes_mut()).unwrap();
    s3.prefill(&ids[..3]).unwrap();
    s3.snapshot(&mut early).unwrap();
    let mut spliced = snap.clone();
    spliced[4..16].copy_from_slice(&early[4..16]);
    assert_eq!(s2.restore(&spliced).unwrap_err(), Error::BadSnapshot);
    set_snapshot_crc(&mut spliced);
    s2.restore(&spliced).unwrap();
    assert_eq!(s2.pos(), 3);
    assert_eq!(s2.restore(&snap[1..]).unwrap_err(), Error::BadSnapshot);
}

/// Makes the CRC of a [`Session::snapshot`] (counter word 7) that of its other bytes.
fn set_snapshot_crc(snap: &mut [u8]) {
    use kvm_core::format::{crc32, crc32_update};
    let crc = crc32_update(crc32(&snap[..28]), &snap[32..]);
    snap[28..32].copy_from_slice(&crc.to_le_bytes());
}

/// A snapshot is restored only if every byte is the one saved: 30 of 30 single-byte
/// changes anywhere in it are refused (in the counters, the state's sums, the window), as
/// is the state zeroed after its first 64 bytes; the session stays as it was.
#[test]
fn a_snapshot_with_any_byte_changed_is_refused() {
    let blob = convert_to_bytes(&golden_dir("growable_power_law"), DType::F32);
    let model = Model::from_bytes(&blob).unwrap();
    let (mut a1, mut a2) = (Arena::new(model.arena_len()), Arena::new(model.arena_len()));
    let mut s1 = Session::new(model, a1.bytes_mut()).unwrap();
    let ids: Vec<u32> = (0..120).map(|i| (i * 29 % 96) as u32).collect();
    s1.prefill(&ids).unwrap();
    let mut snap = vec![0u8; s1.snapshot_len()];
    s1.snapshot(&mut snap).unwrap();
    let mut s2 = Session::new(model, a2.bytes_mut()).unwrap();
    s2.prefill(&ids[..5]).unwrap();
    let mut before = vec![0u8; snap.len()];
    s2.snapshot(&mut before).unwrap();
    let mut refused = 0;
    for i in 0..30usize {
        // Spread over the whole snapshot, the first few in the counters.
        let at = if i < 5 { i * 13 % 64 } else { (i * 7_919 * 131) % snap.len() };
        let mut bad = snap.clone();
        bad[at] ^= if i % 2 == 0 { 1 << (i % 8) } else { 0xFF };
        if s2.restore(&bad) == Err(Error::BadSnapshot) {
            refused += 1;
        }
    }
    assert_eq!(refused, 30, "single-byte changes refused");
    let mut zeroed = snap.clone();
    zeroed[64..].fill(0);
    assert_eq!(s2.restore(&zeroed).unwrap_err(), Error::BadSnapshot);
    let mut after = vec![0u8; snap.len()];
    s2.snapshot(&mut after).unwrap();
    assert_eq!(after, before, "a refused snapshot changed the session");
    s2.restore(&snap).unwrap();
    assert_eq!(s2.pos(), 120);
}

/// Random state-machine settings written into a valid header (valid CRC, so only the
/// config's own checks stand between them and the forward pass): loading, sessions,
/// prefill and decode return errors or logits, never panic. Debug builds also trap any
/// arithmetic overflow on the way.
#[test]
fn random_configs_with_valid_checksums_never_panic() {
    use kvm_core::config::{flags, StateBudget};
    let bases = [
        fixed_basic(),
        convert_to_bytes(&golden_dir("growable_power_law"), DType::F32),
        convert_to_bytes(&golden_dir("hybrid_swa_saturation"), DType::F32),
    ];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    const EDGES: [u32; 12] = [0, 1, 2, 3, 4, 7, 8, 9, 16, 64, 1 << 20, u32::MAX];
    let floats = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 30.0, 1e-30, 1e30, f64::NAN, f64::INFINITY, -f64::INFINITY];
    let (mut accepted, mut decoded) = (0, 0);
    for case in 0..2000 {
        let blob = &bases[case % bases.len()];
        let mut r = [0u64; 20];
        r.iter_mut().for_each(|x| *x = next());
        let small = |x: u64| EDGES[(x % EDGES.len() as u64) as usize];
        let float = |x: u64| floats[(x % floats.len() as u64) as usize];
        let edited = with_header(blob, |h| {
            let c = &mut h.config;
            // One to three of the seventeen settings change, so that many cases stay valid.
            let edits = 1 + r[0] % 3;
            let keep = !(0..edits).fold(0u64, |m, i| m | 1 << (1 + (r[0] >> (2 + 5 * i)) % 17));
            let pick = |bit: u32, field: &mut u32, x: u64| {
                if keep >> bit & 1 == 0 {
                    *field = if x & 1 == 0 { small(x >> 1) } else { (x >> 1) as u32 % 40 };
                }
            };
            pick(1, &mut c.chunk_len, r[1]);
            pick(2, &mut c.window_chunks, r[2]);
            pick(3, &mut c.max_state_chunks, r[3]);
            pick(4, &mut c.state_round_down, r[4]);
            pick(5, &mut c.sink_len, r[5]);
            pick(6, &mut c.rope_dim, r[6]);
            pick(7, &mut h.state_capacity, r[7]);
            if keep >> 8 & 1 == 0 {
                c.state_min_len = small(r[8]) as i32;
            }
            if keep >> 9 & 1 == 0 {
                c.flags = r[9] as u32 & flags::ALL;
            }
            if keep >> 10 & 1 == 0 {
                c.budget = match r[10] % 3 {
                    0 => StateBudget::Fixed,
                    1 => StateBudget::PowerLaw { factor: float(r[10] >> 2), exponent: float(r[11]) },
                    _ => StateBudget::Saturation { n: float(r[10] >> 2) },
                };
            }
            if keep >> 11 & 1 == 0 {
                c.logit_softcap = float(r[12]) as f32;
            }
            if keep >> 12 & 1 == 0 {
                c.residual_scale = float(r[13]) as f32;
            }
            if keep >> 13 & 1 == 0 {
                c.rope_theta = float(r[14]);
            }
            // The hybrid stack's fields (spec §5).
            pick(14, &mut c.alt_layer_every, r[16]);
            pick(15, &mut c.alt_window, r[17]);
            pick(16, &mut c.alt_rope_dim, r[18]);
            if keep >> 17 & 1 == 0 {
                c.alt_rope_theta = float(r[19]);
            }
            // Half of the time the arena holds the new config's natural state (what an
            // exporter writes); otherwise the capacity stays as picked.
            if r[14] >> 63 == 0 {
                h.state_capacity = h.config.natural_state_len().min(u32::MAX as usize) as u32;
            }
        });
        let run = std::panic::catch_unwind(|| {
            let Ok(model) = Model::from_bytes(&edited) else { return (false, false) };
            if model.arena_len() > 8 << 20 {
                return (true, false);
            }
            let mut arena = Arena::new(model.arena_len());
            let Ok(mut session) = Session::new(model, arena.bytes_mut()) else { return (true, false) };
            let tokens: Vec<u32> = (0..1 + r[15] % 40).map(|i| ((r[15] >> 8) + i * 37) as u32 % 97).collect();
            let mut ok = session.prefill(&tokens).is_ok();
            for i in 0..(r[15] >> 20) % 30 {
                ok &= session.decode(((r[15] >> 32) + i * 13) as u32 % 96).is_ok();
            }
            (true, ok)
        });
        let (a, d) =
            run.unwrap_or_else(|_| panic!("case {case} panicked: {:?}", Header::parse(&edited).map(|h| h.config)));
        accepted += a as usize;
        decoded += d as usize;
    }
    // The generator must reach the forward pass, not only the refusals.
    assert!(decoded >= 400 && accepted > decoded, "accepted {accepted}, decoded {decoded}");
}

#[test]
fn packing_at_load_checks_every_tensor_and_leaves_quantized_models_alone() {
    use kvm_runtime::file::{ModelFile, Pages};
    static UNIQUE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let pack = |bytes: &[u8]| {
        let n = UNIQUE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kvm-test-{}-pack-{n}.kvm", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        // A damaged header or a cut file is refused as it is opened, before any packing.
        let packed = ModelFile::open(&path, Pages::Mapped)
            .and_then(|file| file.pack_f32().map(|packed| packed.map(|p| p.bytes().len())));
        std::fs::remove_file(&path).ok();
        packed
    };
    let blob = fixed_basic();
    assert!(pack(&blob).unwrap().is_some_and(|len| len < blob.len()));
    for (i, t) in Model::from_bytes(&blob).unwrap().tensors().enumerate().step_by(3) {
        let mut bad = blob.clone();
        bad[t.offset as usize + t.len as usize / 2] ^= 0x10;
        let err = format!("{:#}", pack(&bad).unwrap_err());
        assert!(err.contains(&format!("checksum mismatch in Tensor {{ index: {i} }}")), "tensor {i}: {err}");
    }
    let mut bad = blob.clone();
    bad[200] ^= 0x10;
    assert!(pack(&bad).is_err(), "a damaged header packed");
    assert!(pack(&blob[..blob.len() / 2]).is_err(), "a truncated file packed");
    let q8 = convert_to_bytes(&golden_dir("fixed_basic"), DType::Q8_0);
    assert_eq!(pack(&q8).unwrap(), None, "a quantized model packed");
}
