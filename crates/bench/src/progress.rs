//! Progress bars on stderr (hidden when stderr is not a terminal).

use std::path::Path;

use arbor_engine::OpenEvent;
use arbor_fetch::Progress;
use indicatif::{ProgressBar, ProgressStyle};

pub fn human_bytes(b: u64) -> String {
    indicatif::HumanBytes(b).to_string()
}

/// A bar for `arbor_fetch` downloads and assembly.
pub fn fetch_bar() -> impl FnMut(Progress) {
    let mut bar: Option<ProgressBar> = None;
    move |p| match p {
        Progress::Start { what, total_bytes } => {
            let b = ProgressBar::new(total_bytes).with_style(
                ProgressStyle::with_template(
                    "{msg:30} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_message(what);
            bar = Some(b);
        }
        Progress::Advance { bytes } => {
            if let Some(b) = &bar {
                b.inc(bytes);
            }
        }
        Progress::Message(m) => match &bar {
            Some(b) => b.println(m),
            None => eprintln!("{m}"),
        },
        Progress::Done => {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
        }
    }
}

/// A bar counting things (tensors, windows, prompts).
pub fn count_bar(what: &str) -> impl FnMut(usize, usize) + use<> {
    let what = what.to_string();
    let mut bar: Option<ProgressBar> = None;
    move |done, total| {
        let b = bar.get_or_insert_with(|| {
            ProgressBar::new(total as u64).with_style(
                ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
                    .expect("valid template")
                    .progress_chars("=> "),
            )
        });
        b.set_message(what.clone());
        b.set_position(done as u64);
        if done >= total {
            b.finish_and_clear();
        }
    }
}

/// A bar for loading a model's tensors.
pub fn load_bar(path: &Path) -> impl FnMut(usize, usize) + use<> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut inner = count_bar("loading tensors");
    let mut announced = false;
    move |done, total| {
        if !announced {
            eprintln!("loading {name}");
            announced = true;
        }
        inner(done, total)
    }
}

/// A counting bar and what it counts.
type Counter<K> = Option<(K, Box<dyn FnMut(usize, usize)>)>;

/// Bars and notes for what opening a run reports.
pub fn open_bar() -> impl FnMut(OpenEvent<'_>) {
    open_bar_with(false)
}

/// [`open_bar`], printing the reasons behind choices too when `explain`.
pub fn open_bar_with(explain: bool) -> impl FnMut(OpenEvent<'_>) {
    let mut fetch = fetch_bar();
    let mut load: Counter<std::path::PathBuf> = None;
    let mut measure: Counter<String> = None;
    move |event| match event {
        OpenEvent::Fetch(p) => fetch(p),
        OpenEvent::Load { path, done, total } => {
            if load.as_ref().is_none_or(|(p, _)| p != path) {
                load = Some((path.to_path_buf(), Box::new(load_bar(path))));
            }
            if let Some((_, bar)) = &mut load {
                bar(done, total);
            }
        }
        OpenEvent::Measure { what, done, total } => {
            if measure.as_ref().is_none_or(|(w, _)| w != what || done <= 1) {
                measure = Some((what.to_string(), Box::new(count_bar(what))));
            }
            if let Some((_, bar)) = &mut measure {
                bar(done, total);
            }
        }
        OpenEvent::Note(note) => eprintln!("{note}"),
        OpenEvent::Explain(line) if explain => eprintln!("{line}"),
        OpenEvent::Explain(_) => {}
    }
}
