//! LoRA adapters of elastic levels: fresh ones (b = 0) change no bit,
//! trained-looking ones apply at their level only (switching attaches and
//! detaches them), split layers add them over held and lent neurons
//! alike, and the file round-trips while bad adapters are refused (candle
//! against burn: arbor-train's `lora_backends`).

use crate::common;
use common::*;

use arbor_elastic::LoraFile;
use arbor_gguf::GgmlType;
use arbor_model::{LanguageModel, Proj};

/// Adapters for `level` of `m` with every `b` value non-zero.
fn adapters(m: &Model, level: f64, seed: u64) -> LoraFile {
    let mut f = LoraFile::new(m.config(), m.elastic(), level, 4, &Proj::ALL, seed).unwrap();
    let mut flat = f.flatten();
    for (i, v) in flat.iter_mut().enumerate() {
        if *v == 0.0 {
            *v = ((i * 7919 % 101) as f32 / 101.0 - 0.5) * 0.1;
        }
    }
    f.unflatten(&flat).unwrap();
    f
}

#[test]
fn adapters_apply_at_their_level_only() {
    let m = tiny(GgmlType::Q8_0, 31);
    let (_source, out) = elastic(&m, "lora");
    let mut model = load(&out.0);
    let plain = |model: &mut Model, level| {
        model.set_level(level).unwrap();
        run(model)
    };
    let (at_half, at_three) = (plain(&mut model, 0.5), plain(&mut model, 0.75));

    let fresh = LoraFile::new(model.config(), model.elastic(), 0.5, 8, &Proj::ALL, 1).unwrap();
    LanguageModel::attach_lora(&mut model, &fresh.to_host()).unwrap();
    assert_eq!(plain(&mut model, 0.5), at_half, "b = 0 adds nothing");

    let f = adapters(&model, 0.5, 2);
    LanguageModel::attach_lora(&mut model, &f.to_host()).unwrap();
    let with = plain(&mut model, 0.5);
    assert!(
        max_diff(&with, &at_half) > 1e-2,
        "the adapters changed nothing"
    );
    assert_eq!(
        plain(&mut model, 0.75),
        at_three,
        "another level runs without them"
    );
    assert_eq!(
        plain(&mut model, 0.5),
        with,
        "switching back attaches them again"
    );
    model.detach_lora(0.5).unwrap();
    assert_eq!(plain(&mut model, 0.5), at_half);
}

#[test]
fn split_layers_add_adapters_over_held_and_lent_neurons() {
    let m = tiny(GgmlType::Q8_0, 37);
    let (_source, out) = elastic(&m, "lora-split");
    let mut split = split_model(&out.0, 1, &[1, 2, 3], arbor_pipeline::Mode::OnDemand);

    let mut whole = load(&out.0);
    for level in [0.5, 0.75] {
        let f = adapters(&whole, level, 5);
        for model in [&mut whole, &mut split] {
            LanguageModel::attach_lora(model, &f.to_host()).unwrap();
            model.set_level(level).unwrap();
        }
        // Bit for bit: the split sums the down projection and its adapter
        // in the whole layer's order.
        assert_eq!(run(&mut split), run(&mut whole), "level {level}");
    }
}

#[test]
fn the_file_round_trips_and_bad_adapters_are_refused() {
    let m = tiny(GgmlType::F32, 41);
    let (source, out) = elastic(&m, "lora-bad");
    let mut model = load(&out.0);
    let mut f = adapters(&model, 0.25, 7);
    f.meta.insert("note".into(), "kept".into());
    f.adam = Some((vec![1.0; f.len()], vec![2.0; f.len()]));
    assert_eq!(LoraFile::from_bytes(&f.to_bytes().unwrap()).unwrap(), f);

    let err = |f: &LoraFile, model: &mut Model| {
        LanguageModel::attach_lora(model, &f.to_host())
            .unwrap_err()
            .to_string()
    };
    // Adapters shaped for one level, labelled another.
    let mut wrong = f.clone();
    wrong.level = 0.75;
    assert!(
        err(&wrong, &mut model).contains("needs"),
        "{}",
        err(&wrong, &mut model)
    );
    wrong.level = 0.6;
    assert!(err(&wrong, &mut model).contains("does not build"));
    wrong.level = 1.5;
    assert!(err(&wrong, &mut model).contains("outside (0, 1]"));
    // Too few layers.
    let mut short = f.clone();
    short.layers.pop();
    assert!(err(&short, &mut model).contains("layers"));
    // A level the file does not build, a rank of 0, a plain model.
    let cfg = model.config().clone();
    assert!(LoraFile::new(&cfg, model.elastic(), 0.6, 4, &Proj::ALL, 1).is_err());
    assert!(LoraFile::new(&cfg, model.elastic(), 0.5, 0, &Proj::ALL, 1).is_err());
    let mut plain = load(&source.0);
    assert!(err(&f, &mut plain).contains("not elastic"));
    // Corrupt bytes.
    let bytes = f.to_bytes().unwrap();
    for bad in [
        &bytes[..bytes.len() / 2],
        b"not a safetensors file".as_slice(),
    ] {
        assert!(LoraFile::from_bytes(bad).is_err());
    }
}
