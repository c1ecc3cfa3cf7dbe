//! Making a backend on a burn device, and the small helpers every op
//! uses: uploads, index lists, errors and shape checks.

use arbor_tensor::{Error, Result};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use crate::BurnBackend;

pub(crate) fn shape_err(op: &'static str, detail: String) -> Error {
    Error::Shape { op, detail }
}

impl BurnBackend {
    /// A backend on the given burn device; `name` is what [`arbor_tensor::Backend::name`]
    /// reports.
    pub fn with_device(device: Device, name: &'static str) -> Self {
        Self {
            device,
            name,
            #[cfg(feature = "cube")]
            blocks: false,
            #[cfg(feature = "cube")]
            max_buffer: usize::MAX,
            #[cfg(feature = "cube")]
            pass: Default::default(),
            resident: crate::weight::Resident::default(),
        }
    }

    /// The pure-Rust CPU backend (SIMD + rayon threads).
    #[cfg(feature = "flex")]
    pub fn flex() -> Self {
        Self::with_device(Device::flex(), "flex")
    }

    /// The ndarray CPU backend (deprecated by burn 0.22 in favour of flex,
    /// kept for comparison).
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    pub fn ndarray() -> Self {
        Self::with_device(Device::ndarray(), "ndarray")
    }

    /// The wgpu backend on the default adapter (a GPU if there is one,
    /// otherwise e.g. Mesa's lavapipe; `CUBECL_WGPU_DEFAULT_DEVICE`
    /// overrides the choice).
    #[cfg(feature = "wgpu")]
    pub fn wgpu() -> Self {
        Self {
            blocks: true,
            max_buffer: crate::cube::MAX_BUFFER_BYTES,
            ..Self::with_device(
                Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
                "wgpu",
            )
        }
    }

    /// This backend keeping a quantized weight in buffers of at most
    /// `bytes` each (whole tiles of 32 rows; 128 MiB unless set): for
    /// devices whose storage buffers are smaller.
    #[cfg(feature = "cube")]
    pub fn max_weight_buffer(self, bytes: usize) -> Self {
        Self {
            max_buffer: bytes,
            ..self
        }
    }

    /// Whether an op on `x` runs our CubeCL kernels: on a CubeCL device,
    /// unless gradients are tracked through `x` (burn's ops know their
    /// backward passes; ours do not).
    #[cfg(feature = "cube")]
    pub(crate) fn own_kernels(&self, x: &Tensor<2>) -> bool {
        #[cfg(feature = "train")]
        if x.is_tracked() {
            return false;
        }
        let _ = x;
        self.blocks
    }

    /// The burn device everything runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::Backend {
            backend: self.name,
            message: message.to_string(),
        }
    }

    pub(crate) fn upload<const D: usize>(&self, data: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
        Tensor::from_data(TensorData::new(data, shape), (&self.device, DType::F32))
    }

    pub(crate) fn indices(&self, idx: impl IntoIterator<Item = usize>) -> Tensor<1, Int> {
        let idx: Vec<i64> = idx.into_iter().map(|i| i as i64).collect();
        let n = idx.len();
        Tensor::from_data(TensorData::new(idx, [n]), &self.device)
    }

    pub(crate) fn check_same(op: &'static str, a: &Tensor<2>, b: &Tensor<2>) -> Result<()> {
        if a.dims() != b.dims() {
            return Err(shape_err(
                op,
                format!("{:?} and {:?} differ", a.dims(), b.dims()),
            ));
        }
        Ok(())
    }
}
