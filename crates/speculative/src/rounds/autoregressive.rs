//! Autoregressive decoding: one plain target pass per token.

use super::Round;
use crate::run::Run;
use crate::{Event, Result};

pub(super) struct Autoregressive;

impl Round for Autoregressive {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()> {
        run.target_step(on)
    }
}
