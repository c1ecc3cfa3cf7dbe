//! The public API used together, as the weight pager uses it: reserve a
//! buffer's worth of budget, then read ranges of a weight file into it.

use std::sync::Arc;

use arbor_paging::{AlignedBuf, DirectReader, Ledger, PagingError, format_bytes, parse_bytes};

#[test]
fn reserve_then_read() {
    // Cargo's per-target scratch directory sits on the build disk, which is
    // more likely than /tmp (often tmpfs) to support O_DIRECT.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("arbor-paging-api-{}.bin", std::process::id()));
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();

    let reader = DirectReader::open(&path).unwrap();
    eprintln!("{}: O_DIRECT = {}", path.display(), reader.is_direct());
    assert_eq!(reader.len(), data.len() as u64);

    let ledger = Ledger::new(parse_bytes("48KiB").unwrap());
    let (offset, len) = (10_001u64, 30_000usize);
    let span = DirectReader::span(offset, len);
    let reservation = ledger.reserve(span as u64, "range").unwrap();
    let mut buf = AlignedBuf::new(span);
    let got = reader.read_into(offset, len, &mut buf).unwrap();
    assert_eq!(got, &data[10_001..40_001]);
    assert_eq!(ledger.used(), reservation.bytes());

    // A second buffer of the same size would not fit.
    let err = ledger.reserve(span as u64, "second range").unwrap_err();
    assert!(matches!(err, PagingError::OverBudget { .. }));
    assert!(err.to_string().contains("second range"), "{err}");
    drop(reservation);
    assert_eq!(ledger.available(), 48 * 1024);

    // Readers and ledgers are shared across threads.
    let reader = Arc::new(reader);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (reader, ledger) = (Arc::clone(&reader), Arc::clone(&ledger));
            std::thread::spawn(move || {
                let _r = ledger.reserve_blocking(40_000, "thread").unwrap();
                let mut buf = AlignedBuf::new(0);
                reader.read_into(t * 4096, 100, &mut buf).unwrap().to_vec()
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        let start = t * 4096;
        assert_eq!(h.join().unwrap(), &data[start..start + 100]);
    }
    assert!(reader.bytes_read() >= 30_200);
    assert_eq!(
        format_bytes(ledger.peak()),
        format_bytes(ledger.peak().max(40_000))
    );
    let _ = std::fs::remove_file(&path);
}
