//! Property: an elastic draft — any level of a random elastic model, with
//! or without LoRA adapters held for its level — drafts losslessly for the
//! whole level: greedy chain and tree decoding give the target's own
//! tokens, whatever the prompt.

use crate::common;
use common::*;

use arbor_elastic::LoraFile;
use arbor_gguf::GgmlType;
use arbor_model::{LanguageModel, Proj};
use arbor_speculative::{Decoding, TreeConfig, decode};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn elastic_drafts_are_lossless(
        seed in 1u64..1000,
        level in prop::sample::select(vec![0.25, 0.5, 0.75]),
        prompt in prop::collection::vec(0u32..200, 1..24),
        tree in any::<bool>(),
        adapters in any::<bool>(),
    ) {
        let m = tiny(GgmlType::Q8_0, seed);
        let (_source, out) = elastic(&m, "prop");
        let mut target = load(&out.0);
        if adapters {
            let mut f = LoraFile::new(target.config(), target.elastic(), level, 4, &Proj::ALL, seed).unwrap();
            let flat: Vec<f32> = (0..f.len()).map(|i| ((i * 31 % 97) as f32 / 97.0 - 0.5) * 0.05).collect();
            f.unflatten(&flat).unwrap();
            LanguageModel::attach_lora(&mut target, &f.to_host()).unwrap();
        }
        let mut draft = target.elastic_draft(level).unwrap();
        let plain = decode(&mut target, None, &prompt, &opts(Decoding::Autoregressive), &mut |_| {}).unwrap();
        let d = if tree { Decoding::Tree(TreeConfig::default()) } else { Decoding::Chain { gamma: 4 } };
        let spec = decode(&mut target, Some(&mut draft), &prompt, &opts(d), &mut |_| {}).unwrap();
        prop_assert_eq!(spec.tokens, plain.tokens);
    }
}
