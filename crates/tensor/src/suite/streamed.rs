//! Weights streamed for one pass and kept in the bytes they were read into
//! ([`Backend::streamed_weight_in`]): the same products as a copy, and the
//! lent bytes held exactly as long as the weight.

use std::sync::Arc;

use super::{Rng, bits, host, random_blocks, tensor, weight_data};
use crate::{Backend, GgmlType, SharedBytes, StableBytes};

/// Bytes owned by a test, whose holders an [`Arc`] counts.
struct Lent(Vec<u8>);

// SAFETY: the vector is never touched after construction.
unsafe impl StableBytes for Lent {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// For each of `types`: a weight built in its lent bytes multiplies bit for
/// bit as the same weight built from a copy ([`Backend::streamed_weight`]),
/// for one row and for several. Where the backend says it keeps the type
/// in place, the weight holds the lent bytes until it is dropped, and no
/// longer; where it does not, it holds nothing of them.
pub fn streamed_in_place<B: Backend>(b: &B, types: &[GgmlType]) {
    let mut rng = Rng(0x1a7e);
    let (rows, cols) = (48, 256);
    for &ty in types {
        let bytes = random_blocks(ty, rows, cols, &mut rng);
        // Eight bytes of lead-in: the weight starts inside its buffer, as
        // a tensor does in a streamer's page-aligned read.
        let mut buf = vec![0u8; 8];
        buf.extend_from_slice(&bytes);
        let owner = Arc::new(Lent(buf));
        let keep = SharedBytes::new(owner.clone(), 8..8 + bytes.len()).unwrap();
        let copied = b
            .streamed_weight(weight_data(ty, rows, cols, &bytes))
            .unwrap();
        let kept = b
            .streamed_weight_in(weight_data(ty, rows, cols, &keep), &keep)
            .unwrap();
        drop(keep);
        let in_place = b.streams_in_place(ty, rows, cols);
        let holders = Arc::strong_count(&owner) - 1;
        assert_eq!(
            holders > 0,
            in_place,
            "{ty}: {holders} holders of the lent bytes"
        );
        same_products(b, &copied, &kept, cols, &mut rng, ty);
        drop(kept);
        assert_eq!(
            Arc::strong_count(&owner),
            1,
            "{ty}: the bytes outlived the weight"
        );
    }
}

/// For each of `types` the backend holds as read ([`Backend::holds_as_read`],
/// which must then also stream in place): a weight built in bytes of its
/// own (as a loader reads a held head into) keeps them for as long as it
/// lives, multiplies bit for bit as [`Backend::weight`]'s, and looks up
/// rows as [`Backend::embedding_table`]'s. Returns how many of `types` were
/// held as read.
pub fn held_as_read<B: Backend>(b: &B, types: &[GgmlType]) -> usize {
    let mut rng = Rng(0x4ead);
    let (rows, cols) = (48, 256);
    let mut held = 0;
    for &ty in types.iter().filter(|&&ty| b.holds_as_read(ty, rows, cols)) {
        held += 1;
        assert!(b.streams_in_place(ty, rows, cols), "{ty}");
        let bytes = random_blocks(ty, rows, cols, &mut rng);
        let owner = Arc::new(Lent(bytes.clone()));
        let keep = SharedBytes::new(owner.clone(), 0..bytes.len()).unwrap();
        let kept = b
            .streamed_weight_in(weight_data(ty, rows, cols, &keep), &keep)
            .unwrap();
        drop(keep);
        assert_eq!(
            Arc::strong_count(&owner),
            2,
            "{ty}: the weight keeps its bytes"
        );
        let copied = b.weight(weight_data(ty, rows, cols, &bytes)).unwrap();
        let table = b
            .embedding_table(weight_data(ty, rows, cols, &bytes))
            .unwrap();
        same_products(b, &copied, &kept, cols, &mut rng, ty);
        let ids = [3u32, 0, 47, 3];
        let want = host(b, &b.embed(&table, &ids).unwrap());
        let got = host(b, &b.embed(&kept, &ids).unwrap());
        assert_eq!(bits(&got), bits(&want), "{ty}");
        drop(kept);
        assert_eq!(
            Arc::strong_count(&owner),
            1,
            "{ty}: the bytes outlived the weight"
        );
    }
    held
}

/// `got` multiplies bit for bit as `want` (both of `cols` columns, of type
/// `ty`) for one row and for several.
fn same_products<B: Backend>(
    b: &B,
    want: &B::Weight,
    got: &B::Weight,
    cols: usize,
    rng: &mut Rng,
    ty: GgmlType,
) {
    for n in [1usize, 5, 33] {
        let x = tensor(b, &rng.vec(n * cols), n, cols);
        let a = host(b, &b.matmul(&x, want).unwrap());
        let c = host(b, &b.matmul(&x, got).unwrap());
        assert_eq!(bits(&c), bits(&a), "{ty}, {n} rows");
    }
}
