//! The burn backend under arbor-tensor's op suite (`arbor_tensor::suite`)
//! on every compiled device: flex, ndarray, wgpu.

use arbor_backend_burn::BurnBackend;
use arbor_tensor::GgmlType;
use arbor_tensor::suite::{self, NEAR};

/// Weight types the suite multiplies; burn holds the first (F32) as a
/// dense matrix on every device, the rest as blocks on wgpu.
const TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

macro_rules! device_tests {
    ($feature:literal, $module:ident, $backend:expr, $name:literal $(, $extra:item)*) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            fn be() -> BurnBackend {
                let be = $backend;
                assert_eq!(arbor_tensor::Backend::name(&be), $name);
                be
            }

            #[test]
            fn matmul_f32() {
                suite::matmul_f32(&be());
            }
            #[test]
            fn matmul_f16() {
                suite::matmul_f16(&be());
            }
            #[test]
            fn matmul_q8_0() {
                suite::matmul_q8_0(&be(), NEAR);
            }
            #[test]
            fn weight_parts() {
                suite::weight_parts(&be(), GgmlType::F32, NEAR);
                suite::weight_parts(&be(), GgmlType::Q8_0, NEAR);
            }
            #[test]
            fn segment_sums_equal_parts_bit_for_bit() {
                for ty in TYPES {
                    suite::segment_sums_equal_parts(&be(), ty);
                }
            }
            #[test]
            fn embed() {
                suite::embed(&be());
            }
            #[test]
            fn add() {
                suite::add(&be());
            }
            #[test]
            fn swiglu() {
                suite::swiglu(&be());
            }
            #[test]
            fn scale_cols() {
                suite::scale_cols(&be());
            }
            #[test]
            fn rms_norm() {
                suite::rms_norm(&be());
            }
            #[test]
            fn select_rows() {
                suite::select_rows(&be());
            }
            #[test]
            fn matmul_tensor() {
                suite::matmul_tensor(&be());
            }
            #[test]
            fn rope() {
                suite::rope(&be());
            }
            #[test]
            fn shape_errors() {
                suite::shape_errors(&be());
            }
            #[test]
            fn narrow_and_concat_cols() {
                suite::narrow_and_concat_cols(&be());
            }
            #[test]
            fn attention_over_a_growing_cache() {
                suite::attention_over_a_growing_cache(&be());
            }
            #[test]
            fn attention_and_cache_edits() {
                suite::attention_and_cache_edits(&be());
            }
            #[test]
            fn kv_truncate_and_keep() {
                suite::kv_truncate_and_keep(&be());
            }
            #[test]
            fn interleaved_heads() {
                suite::interleaved_heads(&be());
            }
            #[test]
            fn long_causal_attention() {
                suite::long_causal_attention(&be());
            }
            $($extra)*
        }
    };
}

device_tests!("flex", flex, BurnBackend::flex(), "flex");
device_tests!("ndarray", ndarray, BurnBackend::ndarray(), "ndarray");
// Only our kernels promise a row the same bits in any batch: burn's CPU
// matmuls on dequantized weights do not (docs/ARCHITECTURE.md).
device_tests!(
    "wgpu",
    wgpu,
    BurnBackend::wgpu(),
    "wgpu",
    #[test]
    fn batched_rows_equal_single_rows_bit_for_bit() {
        suite::batched_rows_equal_single_rows(&be(), &TYPES[1..]);
    }
);
