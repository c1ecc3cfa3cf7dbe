//! The rounds the decoding loop runs, one module per [`Decoding`]: a round
//! drafts (or not), runs the target once and commits what it produced.
//! Adding a decoding means one module here implementing [`Round`] and one
//! arm in [`for_decoding`].

mod autoregressive;
mod chain;
mod guess;
mod ppd;
mod static_tree;
mod tree;

pub(crate) use tree::BATCH as GROWTH_BATCH;

use crate::run::Run;
use crate::{Decoding, Event, Result};

/// One round of a decoding: advances `run` by at least one committed token
/// (or ends it), streaming what it commits and shows to `on`. Called until
/// the run is done; state kept across rounds lives in the implementor.
pub(crate) trait Round {
    fn round(&mut self, run: &mut Run<'_, '_>, on: &mut dyn FnMut(Event<'_>)) -> Result<()>;
}

/// The round `decoding` runs.
pub(crate) fn for_decoding(decoding: &Decoding) -> Box<dyn Round> {
    match decoding {
        Decoding::Autoregressive => Box::new(autoregressive::Autoregressive),
        Decoding::Chain { gamma } => Box::new(chain::Chain { gamma: *gamma }),
        Decoding::StaticTree { width, depth } => Box::new(static_tree::StaticTree {
            width: *width,
            depth: *depth,
        }),
        Decoding::Tree(cfg) => Box::new(tree::Tree::new(cfg.clone())),
        Decoding::Ppd(cfg) => Box::new(ppd::Ppd::new(cfg.clone())),
    }
}
