//! Units' importance from probe gradients against finite differences of
//! the loss when a unit's weights are scaled, on a tiny random model;
//! probes of one change no logit; each layer's removal cost.

use arbor_backend_burn::{BurnBackend, BurnTensor};
use arbor_model::{Decoder, LanguageModel, Mask, Probes};
use arbor_tensor::Backend;
use arbor_train::{Importance, layer_costs};

use crate::common;

const TEXT: [u32; 14] = [3, 17, 42, 8, 8, 51, 2, 33, 19, 60, 7, 1, 12, 40];

/// Probes that scale head `head` of layer `layer` (its query rows and
/// output columns) or neuron `neuron` by `k`; all other columns by 1.
fn scaled(
    m: &Decoder<BurnBackend>,
    layer: usize,
    head: Option<usize>,
    neuron: Option<usize>,
    k: f32,
) -> Vec<Probes<BurnTensor>> {
    let c = m.config();
    let (hd, q) = (c.heads.head_dim, c.heads.n_heads * c.heads.head_dim);
    let b = m.backend();
    let vec = |w: usize, cols: Option<std::ops::Range<usize>>, on: bool| {
        let v: Vec<f32> = (0..w)
            .map(|i| {
                if on && cols.as_ref().is_some_and(|r| r.contains(&i)) {
                    k
                } else {
                    1.0
                }
            })
            .collect();
        b.tensor(&v, 1, w).unwrap()
    };
    (0..c.n_layers)
        .map(|l| {
            let h = head.map(|h| h * hd..(h + 1) * hd);
            let n = neuron.map(|n| n..n + 1);
            let here = l == layer;
            Probes {
                q: vec(q, h.clone(), here),
                attn: vec(q, h, here),
                gate: vec(c.ffn_hidden, n.clone(), here),
                up: vec(c.ffn_hidden, n.clone(), here),
                down: vec(c.ffn_hidden, n, here),
            }
        })
        .collect()
}

/// The summed next-token loss of `TEXT` under `probes`.
fn loss(m: &mut Decoder<BurnBackend>, probes: Vec<Probes<BurnTensor>>) -> f64 {
    m.set_probes(Some(probes)).unwrap();
    let n = TEXT.len();
    m.truncate_cache(0).unwrap();
    let pos: Vec<u32> = (0..(n - 1) as u32).collect();
    let rows: Vec<usize> = (0..n - 1).collect();
    let logits = m
        .forward(&TEXT[..n - 1], &pos, &Mask::causal(0, n - 1), &rows)
        .unwrap();
    m.set_probes(None).unwrap();
    m.truncate_cache(0).unwrap();
    (0..n - 1)
        .map(|r| {
            let row = logits.row(r);
            let max = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = max
                + row
                    .iter()
                    .map(|&x| (x as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            lse - row[TEXT[r + 1] as usize] as f64
        })
        .sum()
}

#[test]
fn probe_gradients_are_the_loss_change_of_scaling_a_unit() {
    let mut m = common::tiny("importance", 21);
    let c = m.config().clone();
    // Probes of one change nothing.
    let n = TEXT.len();
    let pos: Vec<u32> = (0..n as u32).collect();
    let plain = m
        .forward(&TEXT, &pos, &Mask::causal(0, n), &[n - 1])
        .unwrap();
    m.truncate_cache(0).unwrap();
    m.set_probes(Some(scaled(&m, 0, None, None, 1.0))).unwrap();
    let probed = m
        .forward(&TEXT, &pos, &Mask::causal(0, n), &[n - 1])
        .unwrap();
    m.set_probes(None).unwrap();
    m.truncate_cache(0).unwrap();
    assert_eq!(plain, probed);

    let mut imp = Importance::new(&c);
    imp.add_chunk(&mut m, &TEXT).unwrap();
    assert_eq!(imp.tokens, n - 1);
    assert_eq!(m.cache_len(), 0);
    let ones = scaled(&m, 0, None, None, 1.0);
    let full = loss(&mut m, ones);
    assert!(
        (imp.loss_sum - full).abs() < 1e-3 * full,
        "{} vs {full}",
        imp.loss_sum
    );

    let eps = 1e-2f32;
    let fd = |m: &mut Decoder<BurnBackend>, l, h, nn| {
        let (up, down) = (
            scaled(m, l, h, nn, 1.0 + eps),
            scaled(m, l, h, nn, 1.0 - eps),
        );
        let (up, down) = (loss(m, up), loss(m, down));
        (up - down) / (2.0 * eps as f64)
    };
    for (l, h) in [(0, 0), (0, 3), (1, 2)] {
        let numeric = fd(&mut m, l, Some(h), None);
        let got = imp.heads[l][h];
        assert!(
            (numeric - got).abs() < 2e-3 + 0.02 * numeric.abs().max(got.abs()),
            "layer {l} head {h}: {got} against {numeric}"
        );
    }
    for (l, nn) in [(0, 5), (1, 0), (1, 47)] {
        let numeric = fd(&mut m, l, None, Some(nn));
        let got = imp.neurons[l][nn];
        assert!(
            (numeric - got).abs() < 2e-3 + 0.02 * numeric.abs().max(got.abs()),
            "layer {l} neuron {nn}: {got} against {numeric}"
        );
    }
    // Not all zero, and a second chunk adds up.
    assert!(imp.neurons.iter().flatten().any(|&v| v.abs() > 1e-3));
    let before = imp.clone();
    imp.add_chunk(&mut m, &TEXT).unwrap();
    assert_eq!(imp.tokens, 2 * (n - 1));
    assert!((imp.heads[1][2] - 2.0 * before.heads[1][2]).abs() < 1e-4);
}

#[test]
fn each_layer_s_removal_has_a_cost() {
    let m = common::tiny("importance-layers", 22);
    let chunks = vec![TEXT.to_vec(), TEXT[3..].to_vec()];
    let mut ticks = 0;
    let (base, costs) = layer_costs(&m, &chunks, &mut |_, _| ticks += 1).unwrap();
    assert!(base > 0.0);
    assert_eq!(costs.len(), m.config().n_layers);
    assert!(costs.iter().all(|c| c.is_finite() && *c != 0.0));
    assert_eq!(ticks, m.config().n_layers + 1);
    let mut bad = m.self_draft_with(&[true, true]).unwrap();
    assert!(
        Importance::new(bad.config())
            .add_chunk(&mut bad, &[1])
            .is_err()
    );
}

#[test]
fn an_importance_file_reads_back_as_written() {
    let m = common::tiny("importance-file", 23);
    let mut imp = Importance::new(m.config());
    imp.heads[1][2] = -0.25;
    imp.neurons[0][7] = 3.5;
    imp.tokens = 13;
    imp.loss_sum = 40.5;
    let f = arbor_train::ImportanceFile {
        importance: imp,
        layer_costs: vec![0.5, 1.25],
        meta: [("model".to_string(), "tiny".to_string())].into(),
    };
    let back = arbor_train::ImportanceFile::from_bytes(&f.to_bytes().unwrap()).unwrap();
    assert_eq!(back, f);
    let mut bytes = f.to_bytes().unwrap();
    bytes.truncate(bytes.len() - 3);
    assert!(arbor_train::ImportanceFile::from_bytes(&bytes).is_err());
    assert!(arbor_train::ImportanceFile::from_bytes(b"nonsense").is_err());
}

#[test]
fn levels_keep_the_most_important_units_and_masks_drop_the_rest() {
    use arbor_train::prune::{Order, keep_at, masks};
    let mut m = common::tiny("importance-prune", 24);
    let c = m.config().clone();
    let mut imp = Importance::new(&c);
    imp.add_chunk(&mut m, &TEXT).unwrap();
    let f = arbor_train::ImportanceFile {
        importance: imp.clone(),
        layer_costs: vec![2.0, 1.0],
        meta: Default::default(),
    };
    // Level 1 keeps everything, and its masks change no loss.
    let all = keep_at(&f, &c, 1.0, 0, Order::Importance).unwrap();
    assert!(
        all.iter()
            .all(|k| k.heads.iter().chain(&k.neurons).all(|&x| x))
    );
    let chunks = vec![TEXT.to_vec()];
    let full = arbor_train::mean_loss(&mut m, &chunks).unwrap();
    m.set_probes(Some(masks(m.backend(), &c, &all).unwrap()))
        .unwrap();
    assert_eq!(arbor_train::mean_loss(&mut m, &chunks).unwrap(), full);
    // Half: one head of each 2-head KV group, 24 of 48 neurons, the
    // anchor (layer 0, the costlier) whole.
    let half = keep_at(&f, &c, 0.5, 1, Order::Importance).unwrap();
    assert!(half[0].heads.iter().chain(&half[0].neurons).all(|&x| x));
    let k = &half[1];
    assert_eq!(k.heads.iter().filter(|&&x| x).count(), 2);
    assert!(k.heads[..2].contains(&true) && k.heads[2..].contains(&true));
    assert_eq!(k.neurons.iter().filter(|&&x| x).count(), 24);
    let top = (0..48)
        .max_by(|&a, &b| imp.neurons[1][a].abs().total_cmp(&imp.neurons[1][b].abs()))
        .unwrap();
    assert!(k.neurons[top]);
    let file = keep_at(&f, &c, 0.5, 1, Order::File).unwrap();
    assert!(file[1].neurons[..24].iter().all(|&x| x) && !file[1].neurons[24]);
    // Dropping units changes the loss.
    m.set_probes(Some(masks(m.backend(), &c, &half).unwrap()))
        .unwrap();
    assert_ne!(arbor_train::mean_loss(&mut m, &chunks).unwrap(), full);
    m.set_probes(None).unwrap();
    // Across layers: the level is the share of non-anchor neurons kept,
    // the most important of them wherever they are.
    let global = keep_at(&f, &c, 0.5, 0, Order::Global).unwrap();
    let kept: Vec<f64> = (global.iter().zip(&imp.neurons))
        .flat_map(|(k, v)| {
            k.neurons
                .iter()
                .zip(v)
                .filter(|(on, _)| **on)
                .map(|(_, x)| x.abs())
        })
        .collect();
    assert_eq!(kept.len(), 48);
    let dropped_max = (global.iter().zip(&imp.neurons))
        .flat_map(|(k, v)| {
            k.neurons
                .iter()
                .zip(v)
                .filter(|(on, _)| !**on)
                .map(|(_, x)| x.abs())
        })
        .fold(0.0, f64::max);
    assert!(kept.iter().all(|&x| x >= dropped_max));
    assert!(keep_at(&f, &c, 0.0, 0, Order::File).is_err());
    assert!(keep_at(&f, &c, 1.5, 0, Order::File).is_err());
}
