//! Untied token embeddings read row by row through a [`RowSource`]: the
//! logits are bit for bit those of the resident table, the table stays out
//! of the resident bytes, and a source's error comes back whole.

use arbor_backend_candle::CandleBackend;
use arbor_gguf::{GgmlType, GgufFile};
use arbor_model::testing::{MemoryRows, TinyModel, write_temp};
use arbor_model::{Decoder, LanguageModel, Layout, ModelError, Result, RowSource};

fn tiny(arch: &'static str, weight_type: GgmlType, seed: u64) -> TinyModel {
    TinyModel {
        arch,
        weight_type,
        vocab: 256,
        layers: 3,
        tied: false,
        seed,
        ..TinyModel::default()
    }
}

const PROMPT: [u32; 5] = [1, 17, 42, 200, 3];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn rows_from_a_source_give_the_resident_tables_logits() {
    for (i, (arch, ty)) in [
        ("llama", GgmlType::Q8_0),
        ("llama", GgmlType::F16),
        ("qwen2", GgmlType::F32),
    ]
    .into_iter()
    .enumerate()
    {
        let path = write_temp(&tiny(arch, ty, 7 + i as u64).writer(), &format!("rows-{i}"));
        let file = GgufFile::open(&path).unwrap();
        let layout = Layout::from_gguf(file.header()).unwrap();
        assert!(layout.head.is_some());
        let mut table = Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap();
        let resident = vec![true; layout.config.n_layers];
        let mut ticks = 0;
        let mut rows = Decoder::load_partial(
            CandleBackend::new(),
            &file,
            &layout,
            &resident,
            Some(Box::new(MemoryRows::new(&file, &layout))),
            &mut |done, total| {
                ticks += 1;
                assert_eq!(done, ticks);
                assert_eq!(total, file.header().tensors.len());
            },
        )
        .unwrap();
        assert_eq!(ticks, file.header().tensors.len());
        assert_eq!(
            table.resident_bytes() - rows.resident_bytes(),
            layout.embedding.len as u64,
            "{arch} {ty:?}"
        );
        let want = bits(&table.step(&PROMPT).unwrap());
        assert_eq!(bits(&rows.step(&PROMPT).unwrap()), want, "{arch} {ty:?}");
        let want = bits(&table.step(&[9]).unwrap());
        assert_eq!(bits(&rows.step(&[9]).unwrap()), want, "{arch} {ty:?}");
        drop(file);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("row {0} is gone")]
struct Gone(usize);

struct Failing;

impl RowSource for Failing {
    fn row(&mut self, row: usize) -> Result<&[u8]> {
        Err(ModelError::from_source(Gone(row)))
    }
}

#[test]
fn a_row_sources_error_comes_back_whole() {
    let path = write_temp(&tiny("llama", GgmlType::F32, 3).writer(), "rows-failing");
    let file = GgufFile::open(&path).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    let mut m = Decoder::load_partial(
        CandleBackend::new(),
        &file,
        &layout,
        &[true; 3],
        Some(Box::new(Failing)),
        &mut |_, _| {},
    )
    .unwrap();
    let e = m.step(&PROMPT).unwrap_err();
    assert_eq!(e.to_string(), "row 1 is gone");
    assert!(matches!(e.source_as::<Gone>(), Some(Gone(1))));
    assert!(e.source_as::<std::io::Error>().is_none());
    drop(file);
}

#[test]
fn a_tied_embedding_is_a_table_whatever_the_source() {
    let tied = TinyModel {
        tied: true,
        ..tiny("llama", GgmlType::F32, 5)
    };
    let path = write_temp(&tied.writer(), "rows-tied");
    let file = GgufFile::open(&path).unwrap();
    let layout = Layout::from_gguf(file.header()).unwrap();
    assert!(layout.head.is_none());
    let mut m = Decoder::load_partial(
        CandleBackend::new(),
        &file,
        &layout,
        &[true; 3],
        Some(Box::new(Failing)),
        &mut |_, _| {},
    )
    .unwrap();
    let mut table = Decoder::load(CandleBackend::new(), &file, &mut |_, _| {}).unwrap();
    assert_eq!(m.resident_bytes(), table.resident_bytes());
    assert_eq!(
        bits(&m.step(&PROMPT).unwrap()),
        bits(&table.step(&PROMPT).unwrap())
    );
    drop(file);
}
