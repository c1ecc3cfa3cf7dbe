//! Other engines in the same budget benchmark: llama.cpp's
//! `llama-completion` (the target alone, weights mmapped) and
//! `llama-speculative` (with the draft model), each prompt in its own
//! process inside the same cgroup limit as arbor's rows (or, with
//! `--unconfined`, as unconfined as they are), on the same GGUF
//! files and chat-templated prompts, greedy, with a context sized to the
//! request (llama.cpp's default context allocates ~1 GiB of KV cache and is
//! killed under these limits).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::budgeted::{BudgetRow, limits, measured_peak, settle_storage};
use crate::cgroup::Hierarchy;

/// A peer engine to run: where its binaries are.
pub struct Peer {
    pub dir: PathBuf,
}

impl Peer {
    /// `llama.cpp=DIR`.
    pub fn parse(spec: &str) -> Result<Self> {
        let Some(("llama.cpp", dir)) = spec.split_once('=') else {
            bail!("--peer takes llama.cpp=DIR (the directory of llama-completion), got `{spec}`");
        };
        let dir = PathBuf::from(dir);
        for tool in ["llama-completion", "llama-speculative"] {
            if !dir.join(tool).is_file() {
                bail!(
                    "--peer llama.cpp: no {tool} in {} (build it with benches/build-llama-cpp.sh)",
                    dir.display()
                );
            }
        }
        Ok(Self { dir })
    }
}

/// What one peer run needs.
pub struct PeerRun<'a> {
    pub target: &'a Path,
    pub draft: Option<&'a Path>,
    /// Chat-templated prompts, as raw text.
    pub prompts: &'a [String],
    pub tokens: usize,
    /// Context for the longest prompt and the new tokens.
    pub context: usize,
    /// Read bandwidth cap of `--read-limit`, bytes/s.
    pub read_limit: Option<u64>,
    /// Where the groups are made; `None`: `--unconfined`.
    pub cgroups: Option<&'a Hierarchy>,
}

/// Runs llama.cpp target-only and speculative (when a draft model is
/// given) under `budget`, one row each.
pub fn run(peer: &Peer, job: &PeerRun<'_>, budget: u64) -> Result<Vec<BudgetRow>> {
    let mut rows = vec![tool_row(peer, job, budget, false)?];
    if job.draft.is_some() {
        rows.push(tool_row(peer, job, budget, true)?);
    }
    Ok(rows)
}

fn tool_row(peer: &Peer, job: &PeerRun<'_>, budget: u64, speculative: bool) -> Result<BudgetRow> {
    let name = if speculative {
        "llama.cpp speculative"
    } else {
        "llama.cpp target only"
    };
    eprintln!("{name} inside {}", arbor_engine::format_bytes(budget));
    let mut row = BudgetRow {
        strategy: name.into(),
        budget_bytes: budget,
        peer: true,
        ..BudgetRow::default()
    };
    let (mut tokens, mut secs) = (0usize, 0f64);
    settle_storage(job.target)?;
    for prompt in job.prompts {
        // llama.cpp maps the file: pages another process left in the page
        // cache (charged to a group that is gone) would serve it without
        // counting against this limit (measured: "33 tok/s" under 800 MiB).
        // Best effort: only root may drop them.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "1");
        let limits = limits(job.target, Some(budget), job.read_limit)?;
        let group = job.cgroups.map(|h| h.group(&limits)).transpose()?;
        let mut cmd = command(peer, job, prompt, speculative);
        if let Some(g) = &group {
            g.confine(&mut cmd)?;
        }
        let (out, rss) =
            output_and_peak_rss(&mut cmd).with_context(|| format!("running {name}"))?;
        let (peak, source) = measured_peak(group.as_ref(), rss);
        row.peak_bytes = row.peak_bytes.max(peak);
        row.peak_source = source;
        let log = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            row.killed = std::os::unix::process::ExitStatusExt::signal(&out.status).is_some();
            row.peak_source = format!("{}; did not finish ({})", row.peak_source, out.status);
            break;
        }
        let (n, s) = if speculative {
            decoded(&log)
        } else {
            eval(&log)
        }
        .with_context(|| format!("reading {name}'s timings"))?;
        if speculative {
            row.mean_accepted = accept_rate(&log).unwrap_or(0.0);
        }
        tokens += n;
        secs += s;
        row.prompts += 1;
    }
    row.generated = tokens;
    row.decode_secs = secs;
    row.tok_s = tokens as f64 / secs.max(1e-9);
    eprintln!(
        "  {:.2} tok/s, peak {} ({})",
        row.tok_s,
        arbor_engine::format_bytes(row.peak_bytes),
        row.peak_source
    );
    Ok(row)
}

/// `cmd.output()`, and the child's peak RSS in bytes (its own, from
/// `wait4`: what a peer row reports where no cgroup peak can be read).
fn output_and_peak_rss(cmd: &mut Command) -> std::io::Result<(std::process::Output, u64)> {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        unreachable!("both were piped");
    };
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        err.read_to_end(&mut buf).map(|_| buf)
    });
    let mut stdout = Vec::new();
    out.read_to_end(&mut stdout)?;
    let stderr = err
        .join()
        .map_err(|_| std::io::Error::other("reading the child's stderr panicked"))??;
    let (mut status, pid) = (0, child.id() as libc::pid_t);
    // SAFETY: zeroed is a valid rusage; wait4 reaps our own child, which
    // std's `Child` is not asked to wait for afterwards.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let output = std::process::Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout,
        stderr,
    };
    // Linux reports ru_maxrss in KiB.
    Ok((output, usage.ru_maxrss.max(0) as u64 * 1024))
}

fn command(peer: &Peer, job: &PeerRun<'_>, prompt: &str, speculative: bool) -> Command {
    let tool = if speculative {
        "llama-speculative"
    } else {
        "llama-completion"
    };
    let mut cmd = Command::new(peer.dir.join(tool));
    cmd.arg("-m")
        .arg(job.target)
        .args(["-p", prompt])
        .args(["-n", &job.tokens.to_string()])
        .args(["-c", &job.context.to_string()])
        .args(["-t", &rayon::current_num_threads().to_string()])
        .args(["--temp", "0"])
        // Every run times the same number of tokens: a prompt the model
        // answers with an early end-of-turn would otherwise time one pass
        // (measured: "31 tok/s" for one token under a memory limit).
        .arg("--ignore-eos");
    match (speculative, job.draft) {
        (true, Some(d)) => {
            cmd.arg("-md").arg(d).args(["--spec-draft-n-max", "8"]);
        }
        _ => {
            cmd.args(["-no-cnv", "--no-display-prompt"]);
        }
    }
    cmd
}

/// `eval time = X ms / N runs` of llama-completion (not the prompt's).
fn eval(log: &str) -> Option<(usize, f64)> {
    let line = log
        .lines()
        .find(|l| l.contains(" eval time =") && !l.contains("prompt eval"))?;
    let after = line.split("eval time =").nth(1)?;
    let ms: f64 = after.split_whitespace().next()?.parse().ok()?;
    let runs: usize = after
        .split('/')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((runs, ms / 1e3))
}

/// `decoded N tokens in X seconds` of llama-speculative.
fn decoded(log: &str) -> Option<(usize, f64)> {
    let line = log
        .lines()
        .find(|l| l.contains("decoded") && l.contains("tokens in"))?;
    let after = line.split("decoded").nth(1)?;
    let mut words = after.split_whitespace();
    let n: usize = words.next()?.parse().ok()?;
    let secs: f64 = words.nth(2)?.parse().ok()?;
    Some((n, secs))
}

/// `accept = P%` of llama-speculative, as a fraction.
fn accept_rate(log: &str) -> Option<f64> {
    let line = log
        .lines()
        .find(|l| l.contains("accept") && l.contains('%'))?;
    let p: f64 = line
        .split('=')
        .nth(1)?
        .trim()
        .trim_end_matches('%')
        .parse()
        .ok()?;
    Some(p / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama_cpp_timings() {
        let completion = "0.03.888.552 I common_perf_print: prompt eval time =     984.31 ms /    26 tokens (   37.86 ms per token,    26.41 tokens per second)\n\
            0.03.888.579 I common_perf_print:        eval time =    1476.37 ms /    15 runs   (   98.42 ms per token,    10.16 tokens per second)";
        assert_eq!(eval(completion), Some((15, 1.47637)));
        let spec = "0.15.185.352 I encoded   15 tokens in    0.683 seconds, speed:   21.967 t/s\n\
            0.15.185.451 I decoded   17 tokens in    8.940 seconds, speed:    1.902 t/s\n\
            0.15.185.643 I accept    = 20.833%";
        assert_eq!(decoded(spec), Some((17, 8.94)));
        assert!((accept_rate(spec).unwrap() - 0.20833).abs() < 1e-9);
        assert_eq!(eval("nothing here"), None);
    }

    #[test]
    fn output_and_peak_rss_of_a_child() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let (out, rss) = output_and_peak_rss(&mut cmd).unwrap();
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
        // A shell holds at least a few hundred KiB.
        assert!(rss > 100 << 10, "{rss}");
    }

    #[test]
    fn peer_specs_are_checked() {
        assert!(Peer::parse("vllm=/x").is_err());
        assert!(Peer::parse("llama.cpp=/no/such/dir").is_err());
    }
}
