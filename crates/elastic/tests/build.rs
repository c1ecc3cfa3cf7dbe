//! Elastic files built from tiny random models: the whole level is the
//! original model up to rounding, every level is the whole model with the
//! units it drops masked out, an elastic draft drafts losslessly, and bad
//! files and levels are refused.

use arbor_backend_candle::CandleBackend;
use arbor_elastic::{Order, build};
use arbor_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use arbor_model::{Elastic, LanguageModel, Layout, Probes};
use arbor_speculative::{Decoding, TreeConfig, decode};
use arbor_tensor::Backend;

use crate::common;
use common::*;

#[test]
fn the_whole_level_is_the_original_model_up_to_rounding() {
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        let m = tiny(ty, 3);
        let (source, out) = elastic(&m, "whole");
        let mut original = load(&source.0);
        let mut whole = load(&out.0);
        assert_eq!(whole.levels(), Some(&[0.25, 0.5, 0.75, 1.0][..]));
        let (a, b) = (run(&mut original), run(&mut whole));
        // Columns of the output projection moved, the down projection was
        // quantized again to Q8_0: sums round differently, nothing else.
        let d = max_diff(&a, &b);
        assert!(d < 0.05, "{ty}: logits differ by {d}");
        let scale = a.iter().flatten().map(|x| x.abs()).fold(0.0, f32::max);
        assert!(scale > 1.0, "logits too small to tell: {scale}");
    }
}

/// Probes of the whole level that zero the heads and neurons a cut drops.
fn masks(model: &Model, e: &Elastic, level: usize) -> Vec<Probes<Vec<f32>>> {
    let c = model.config();
    let d = c.heads.head_dim;
    (0..c.n_layers)
        .map(|i| {
            let cut = e.cuts[level][i];
            let heads: Vec<f32> = (0..c.heads.n_heads * d)
                .map(|j| if j < cut.heads * d { 1.0 } else { 0.0 })
                .collect();
            let neurons: Vec<f32> = (0..c.ffn_hidden)
                .map(|j| if j < cut.neurons { 1.0 } else { 0.0 })
                .collect();
            Probes {
                q: heads.clone(),
                attn: heads,
                gate: neurons.clone(),
                up: neurons.clone(),
                down: neurons,
            }
        })
        .collect()
}

#[test]
fn every_level_is_the_whole_model_with_the_dropped_units_masked() {
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        let m = tiny(ty, 5);
        let (_source, out) = elastic(&m, "levels");
        let mut model = load(&out.0);
        let e = model.elastic().unwrap().clone();
        let b = CandleBackend::new();
        let mut previous: Option<Vec<Vec<f32>>> = None;
        for (l, &level) in e.levels.iter().enumerate() {
            assert_eq!(model.set_level(level).unwrap(), level);
            let got = run(&mut model);
            // The same cut by probes at the whole level.
            model.set_level(1.0).unwrap();
            let probes = masks(&model, &e, l)
                .into_iter()
                .map(|p| Probes {
                    q: b.tensor(&p.q, 1, p.q.len()).unwrap(),
                    attn: b.tensor(&p.attn, 1, p.attn.len()).unwrap(),
                    gate: b.tensor(&p.gate, 1, p.gate.len()).unwrap(),
                    up: b.tensor(&p.up, 1, p.up.len()).unwrap(),
                    down: b.tensor(&p.down, 1, p.down.len()).unwrap(),
                })
                .collect();
            model.set_probes(Some(probes)).unwrap();
            let want = run(&mut model);
            model.set_probes(None).unwrap();
            let d = max_diff(&got, &want);
            assert!(d < 1e-3, "{ty}, level {level}: {d}");
            if let Some(p) = &previous {
                assert!(
                    max_diff(p, &got) > 1e-2,
                    "{ty}: level {level} changed nothing"
                );
            }
            previous = Some(got);
        }
    }
}

#[test]
fn file_order_keeps_the_units_where_they_were() {
    // F32 output projections move single heads; Q8_0 blocks hold two.
    for (ty, stored) in [
        (GgmlType::F32, [0, 4, 1, 5, 2, 6, 3, 7]),
        (GgmlType::Q8_0, [0, 1, 4, 5, 2, 3, 6, 7]),
    ] {
        let m = tiny(ty, 7);
        let source = Temp::write(&m.writer(), "file");
        let out = Temp::new("file-elastic");
        build(
            &source.0,
            &out.0,
            None,
            &options(Order::File),
            &mut |_, _| {},
        )
        .unwrap();
        let (a, b) = (
            GgufFile::open(&source.0).unwrap(),
            GgufFile::open(&out.0).unwrap(),
        );
        // Neurons stay: gate rows are the file's bytes.
        assert_eq!(
            a.tensor("blk.1.ffn_gate.weight").unwrap().1,
            b.tensor("blk.1.ffn_gate.weight").unwrap().1
        );
        // Heads are only interleaved across the two KV heads.
        let (qa, qb) = (
            a.tensor_f32("blk.1.attn_q.weight").unwrap(),
            b.tensor_f32("blk.1.attn_q.weight").unwrap(),
        );
        let head = |v: &[f32], h: usize| v[h * 16 * 128..(h + 1) * 16 * 128].to_vec();
        for (at, from) in stored.into_iter().enumerate() {
            assert_eq!(head(&qb, at), head(&qa, from), "{ty}: head {at}");
        }
        assert_eq!(b.header().get_str("arbor.elastic.order").unwrap(), "file");
        // Scores are needed for the other orders.
        let e = build(
            &source.0,
            &Temp::new("x").0,
            None,
            &options(Order::Importance),
            &mut |_, _| {},
        );
        assert!(e.unwrap_err().to_string().contains("needs scores"));
    }
}

#[test]
fn an_elastic_draft_drafts_losslessly_for_the_whole_level() {
    let m = tiny(GgmlType::Q8_0, 11);
    let (_source, out) = elastic(&m, "draft");
    let mut target = load(&out.0);
    let prompts: [Vec<u32>; 2] = [
        vec![5, 77, 3, 101, 9],
        (0..30).map(|i| i * 37 % 23).collect(),
    ];
    let mut accepted = 0;
    for level in [0.25, 0.75] {
        let mut draft = target.elastic_draft(level).unwrap();
        assert_eq!(draft.level(), level);
        for prompt in &prompts {
            let plain = decode(
                &mut target,
                None,
                prompt,
                &opts(Decoding::Autoregressive),
                &mut |_| {},
            )
            .unwrap();
            for d in [
                Decoding::Chain { gamma: 4 },
                Decoding::Tree(TreeConfig::default()),
            ] {
                let spec = decode(
                    &mut target,
                    Some(&mut draft),
                    prompt,
                    &opts(d.clone()),
                    &mut |_| {},
                )
                .unwrap();
                assert_eq!(spec.tokens, plain.tokens, "level {level}, {d:?}");
                accepted += spec.stats.accepted_draft_tokens;
            }
        }
    }
    assert!(
        accepted > 0,
        "the elastic drafts never got a token accepted"
    );
}

#[test]
fn bad_levels_and_files_are_refused() {
    let m = tiny(GgmlType::F32, 13);
    let (source, out) = elastic(&m, "bad");
    let mut model = load(&out.0);
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let e = model.set_level(bad).unwrap_err().to_string();
        assert!(e.contains("outside (0, 1]"), "{bad}: {e}");
    }
    let e = model.set_level(0.1).unwrap_err().to_string();
    assert!(e.contains("below the lowest level"), "{e}");
    // An unlisted level rounds down to the nearest built one.
    assert_eq!(model.set_level(0.6).unwrap(), 0.5);
    assert!(model.elastic_draft(1.2).is_err());
    // A plain model has no levels.
    let mut plain = load(&source.0);
    assert!(
        plain
            .set_level(0.5)
            .unwrap_err()
            .to_string()
            .contains("not elastic")
    );
    // Building from an elastic file.
    let e = build(
        &out.0,
        &Temp::new("again").0,
        None,
        &options(Order::File),
        &mut |_, _| {},
    );
    assert!(e.unwrap_err().to_string().contains("already elastic"));

    // Metadata that does not fit the model.
    let file = GgufFile::open(&out.0).unwrap();
    let tampered = |key: &str, value: Value| {
        let mut w = GgufWriter::new();
        for (k, v) in &file.header().metadata {
            w.add_meta(k.clone(), if k == key { value.clone() } else { v.clone() });
        }
        for info in &file.header().tensors {
            w.add_tensor(
                &info.name,
                &info.dims,
                info.ty,
                file.tensor_bytes(info).to_vec(),
            );
        }
        let t = Temp::write(&w, "tampered");
        let h = GgufFile::open(&t.0).unwrap();
        Layout::from_gguf(h.header()).unwrap_err().to_string()
    };
    let e = tampered(
        "arbor.elastic.levels",
        Value::Array(vec![Value::F64(0.5), Value::F64(0.2)]),
    );
    assert!(e.contains("elastic metadata"), "{e}");
    let e = tampered("arbor.elastic.heads", Value::Array(vec![Value::U32(8); 3]));
    assert!(e.contains("elastic metadata"), "{e}");
    let mut heads: Vec<Value> = (0..16).map(|_| Value::U32(8)).collect();
    heads[5] = Value::U32(3);
    let e = tampered("arbor.elastic.heads", Value::Array(heads));
    assert!(e.contains("whole rounds"), "{e}");
    let e = tampered("arbor.elastic.anchors", Value::Array(vec![Value::U32(9)]));
    assert!(e.contains("anchor layer 9"), "{e}");

    // A model without known units.
    let mut w = m.writer();
    w.add_meta("general.architecture", Value::String("mamba".into()));
    let odd = Temp::write(&w, "mamba");
    let e = build(
        &odd.0,
        &Temp::new("y").0,
        None,
        &options(Order::File),
        &mut |_, _| {},
    );
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("unsupported architecture")
    );
}
