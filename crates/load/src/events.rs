//! What opening a run reports as it goes, and the model names it resolves.

use std::path::{Path, PathBuf};

use crate::{EngineError, Result};

/// What opening a run reports as it goes.
#[derive(Debug)]
pub enum OpenEvent<'a> {
    /// A model download (only when a registered model is missing).
    Fetch(arbor_fetch::Progress),
    /// Tensors of `path` loaded so far.
    Load {
        path: &'a Path,
        done: usize,
        total: usize,
    },
    /// A measurement (latency curve sizes, disk reads) under way.
    Measure {
        what: &'a str,
        done: usize,
        total: usize,
    },
    /// A decision or fact worth a line on stderr.
    Note(&'a str),
    /// Why a decision was taken (the `auto` planner's estimates): shown
    /// when asked for (`--explain`).
    Explain(&'a str),
}

/// A model path, or a registered short name (fetched when missing).
pub fn resolve_or_fetch(name: &str, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<PathBuf> {
    let fetched = match arbor_fetch::model_entry(name) {
        Some(entry) => arbor_fetch::fetch_model(entry, &mut |p| progress(OpenEvent::Fetch(p))),
        None => arbor_fetch::resolve_model(name),
    };
    fetched.map_err(|e| EngineError::Invalid(e.to_string()))
}

/// An error while loading `path`, saying which file it was.
pub fn loading(path: &Path) -> impl FnOnce(EngineError) -> EngineError + use<> {
    let path = path.to_path_buf();
    move |e| EngineError::Load {
        path,
        inner: Box::new(e),
    }
}

/// Loading progress of `path` as open events.
pub fn load_events<'a>(
    path: &'a Path,
    progress: &'a mut dyn FnMut(OpenEvent<'_>),
) -> impl FnMut(usize, usize) + 'a {
    move |done, total| progress(OpenEvent::Load { path, done, total })
}
