//! `arbor bench serve`: an `arbor serve` on loopback (in this process)
//! under N concurrent streaming clients for a bounded time — requests
//! served, errors, time to first token (p50/p99), tokens per second, and
//! the process's resident memory and threads over time — then, optionally,
//! K clients that disconnect mid-stream or while queued, after which the
//! server must still serve with no growth in memory or threads. With
//! `--slots` the server runs that many requests at once (their passes
//! batched); `--check-alone` then asks each prompt again alone and compares the
//! greedy texts.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use arbor_engine::{Engine, RunConfig};
use arbor_plot::{LineChart, LineSeries, line_chart};
use arbor_serve::ServeOptions;
use arbor_serve::client::{Events, http, metric};
use serde_json::json;

use crate::tuning::TuningArgs;
use crate::{progress, prompts, sys};

#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchServeArgs {
    /// Model path or short name.
    #[cfg_attr(feature = "clap", arg(long, default_value = "smollm2-135m"))]
    pub model: String,
    #[cfg_attr(feature = "clap", arg(long))]
    pub draft: Option<String>,
    #[cfg_attr(feature = "clap", arg(long, default_value = "autoregressive"))]
    pub strategy: String,
    #[cfg_attr(feature = "clap", command(flatten))]
    pub tuning: TuningArgs,
    #[cfg_attr(feature = "clap", arg(long))]
    pub memory_budget: Option<String>,
    /// Longest prompt + new tokens one request may hold under a memory
    /// budget (per slot) [default: max tokens + 512].
    #[cfg_attr(feature = "clap", arg(long))]
    pub context: Option<usize>,
    #[cfg_attr(feature = "clap", arg(long))]
    pub backend: Option<String>,
    /// Concurrent streaming clients.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 8))]
    pub clients: usize,
    /// Requests the server runs at once (see `arbor serve --slots`).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub slots: usize,
    /// After the clients: each prompt they sent, asked again with nothing
    /// else running; every text must equal what it got under load.
    #[cfg_attr(feature = "clap", arg(long))]
    pub check_alone: bool,
    /// How long the clients keep sending requests.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 60))]
    pub seconds: u64,
    /// New tokens per request.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 64))]
    pub max_tokens: usize,
    /// mt-bench, sharegpt, or a file with one JSON string per line.
    #[cfg_attr(feature = "clap", arg(long, default_value = "mt-bench"))]
    pub prompts: String,
    /// Then this many clients that disconnect mid-stream (or while queued).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub kill: usize,
    /// Rounds of `--kill` clients, one after another (a second round
    /// tells a bounded step in memory from growth).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub kill_rounds: usize,
    /// One JSON object on stdout (the table goes to stderr).
    #[cfg_attr(feature = "clap", arg(long))]
    pub json: bool,
    /// Where to draw resident memory and threads over time.
    #[cfg_attr(feature = "clap", arg(long, default_value = "arbor-bench-serve.png"))]
    pub plot: std::path::PathBuf,
}

/// One finished streaming request.
struct Done {
    prompt: usize,
    ttft: f64,
    /// Seconds per token after the first.
    tpot: Option<f64>,
    tokens: u64,
    text: String,
}

/// Streams one chat request; its time to first text and tokens, or why it
/// failed.
fn one(addr: SocketAddr, model: &str, prompt: &str, max_tokens: usize) -> Result<Done, String> {
    let start = Instant::now();
    let body = json!({
        "model": model, "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": prompt}],
    });
    let mut events =
        Events::open(addr, "/v1/chat/completions", &body).map_err(|e| e.to_string())?;
    if events.status != 200 {
        let status = events.status;
        return Err(format!("status {status}: {}", events.rest().join(" ")));
    }
    let (mut ttft, mut tokens, mut done) = (None, 0, false);
    let mut text = String::new();
    while let Some(data) = events.next_data() {
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: serde_json::Value = serde_json::from_str(&data).map_err(|e| e.to_string())?;
        if v.get("error").is_some() {
            return Err(v["error"]["message"].to_string());
        }
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
            if ttft.is_none() {
                ttft = Some(start.elapsed().as_secs_f64());
            }
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n;
        }
    }
    let total = start.elapsed().as_secs_f64();
    let ttft = ttft.unwrap_or(total);
    match done {
        true => Ok(Done {
            prompt: 0,
            ttft,
            tpot: (tokens > 1).then(|| (total - ttft) / (tokens - 1) as f64),
            tokens,
            text,
        }),
        false => Err("the stream ended without [DONE]".into()),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Resident MiB and threads, sampled every second while the bench runs.
type Samples = Arc<Mutex<Vec<(f64, f64, f64)>>>;

fn sample(samples: &Samples, start: Instant) {
    let rss = sys::rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    let threads = sys::threads().unwrap_or(0) as f64;
    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
    s.push((start.elapsed().as_secs_f64(), rss, threads));
}

/// Waits until the server has no request queued or running.
fn idle(addr: SocketAddr, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let busy = metric(addr, "busy").unwrap_or(1.0) + metric(addr, "queue_depth").unwrap_or(1.0);
        if busy == 0.0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

pub fn run(args: &BenchServeArgs, device: &RunConfig) -> Result<()> {
    if args.clients == 0 || args.seconds == 0 || args.max_tokens == 0 {
        bail!("--clients, --seconds and --max-tokens must be at least 1");
    }
    let texts: Vec<String> = (prompts::load_prompts(&args.prompts, None)?.into_iter())
        .map(|p| p.text)
        .collect();
    if texts.is_empty() {
        bail!("no prompts in {}", args.prompts);
    }
    let slots = args.slots.max(1);
    let config = device.clone().merge(RunConfig {
        target: Some(args.model.clone()),
        draft: args.draft.clone(),
        backend: args.backend.clone(),
        memory_budget: args.memory_budget.clone(),
        strategy: Some(args.strategy.clone()),
        tuning: args.tuning.tuning(),
        max_tokens: Some(args.max_tokens),
        context: args.context,
        ..RunConfig::default()
    });
    let config = arbor_serve::slots::for_slots(config, slots);
    let run = Engine::open(&config, &mut progress::open_bar_with(false))?;
    let strategy = run.strategy().name();
    let server = arbor_serve::start(
        run,
        ServeOptions {
            port: 0,
            queue: args.clients + args.kill + 4,
            slots,
            ..ServeOptions::default()
        },
    )?;
    let addr = server.addr();
    let model = http(addr, "GET", "/v1/models", &[], "")?.json()["data"][0]["id"]
        .as_str()
        .context("the server lists no model")?
        .to_string();
    // One request first: lazily built state is not growth.
    one(addr, &model, &texts[0], args.max_tokens).map_err(anyhow::Error::msg)?;

    let start = Instant::now();
    let samples: Samples = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (samples, stop) = (samples.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sample(&samples, start);
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    let deadline = start + Duration::from_secs(args.seconds);
    let mut bar = progress::count_bar("seconds of clients streaming");
    let clients: Vec<_> = (0..args.clients)
        .map(|c| {
            let (model, texts, max) = (model.clone(), texts.clone(), args.max_tokens);
            std::thread::spawn(move || {
                let (mut done, mut errors) = (Vec::new(), Vec::new());
                let mut i = c;
                while Instant::now() < deadline {
                    let prompt = i % texts.len();
                    match one(addr, &model, &texts[prompt], max) {
                        Ok(d) => done.push(Done { prompt, ..d }),
                        Err(e) => errors.push(e),
                    }
                    i += 1;
                }
                (done, errors)
            })
        })
        .collect();
    let total = args.seconds as usize;
    while Instant::now() < deadline {
        bar(
            start.elapsed().as_secs().min(args.seconds - 1) as usize,
            total,
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    bar(total, total);
    let (mut done, mut errors) = (Vec::new(), Vec::new());
    for c in clients {
        let (d, e) = c
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
        done.extend(d);
        errors.extend(e);
    }
    let soak_secs = start.elapsed().as_secs_f64();
    sample(&samples, start);
    let waited = metric(addr, "queue_wait_seconds_sum").unwrap_or(0.0)
        / metric(addr, "queue_wait_seconds_count")
            .unwrap_or(1.0)
            .max(1.0);
    let per_pass = metric(addr, "batched_sequences_total").unwrap_or(0.0)
        / metric(addr, "batched_passes_total").unwrap_or(0.0).max(1.0);
    let verified = match args.check_alone {
        false => serde_json::Value::Null,
        true => verify(addr, &model, &texts, args.max_tokens, &done)?,
    };

    let killed: Vec<serde_json::Value> = (0..args.kill_rounds)
        .filter(|_| args.kill > 0)
        .map(|_| {
            leave(
                addr,
                &model,
                &texts,
                args.kill,
                args.max_tokens,
                &samples,
                start,
            )
        })
        .collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    server.shutdown()?;

    let mut ttft: Vec<f64> = done.iter().map(|d| d.ttft).collect();
    ttft.sort_by(f64::total_cmp);
    let mut tpot: Vec<f64> = done.iter().filter_map(|d| d.tpot).collect();
    tpot.sort_by(f64::total_cmp);
    let tokens: u64 = done.iter().map(|d| d.tokens).sum();
    let samples = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let rss: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let row = json!({
        "model": args.model,
        "strategy": strategy,
        "memory_budget": args.memory_budget,
        "clients": args.clients,
        "slots": slots,
        "seconds": soak_secs,
        "max_tokens": args.max_tokens,
        "requests": done.len(),
        "errors": errors.len(),
        "first_errors": errors.iter().take(3).collect::<Vec<_>>(),
        "ttft_p50_s": percentile(&ttft, 0.5),
        "ttft_p99_s": percentile(&ttft, 0.99),
        "tpot_p50_s": percentile(&tpot, 0.5),
        "tpot_p99_s": percentile(&tpot, 0.99),
        "queue_wait_mean_s": waited,
        "requests_per_pass": per_pass,
        "verified": verified,
        "tokens_per_s": tokens as f64 / soak_secs,
        "rss_mib_start": rss.first().copied().unwrap_or(0.0),
        "rss_mib_end_of_soak": samples.iter().rev().find(|s| s.0 <= soak_secs + 0.5).map_or(0.0, |s| s.1),
        "rss_mib_max": rss.iter().copied().fold(0.0, f64::max),
        "killed": killed,
    });
    let f = |k: &str| row[k].as_f64().unwrap_or(0.0);
    eprintln!(
        "{} clients, {} slots, {:.0} s, {} ({}): {} requests, {} errors, TTFT p50 {:.2} s p99 \
         {:.2} s, TPOT p50 {:.3} s p99 {:.3} s, queue wait {:.2} s, {:.1} tok/s, {:.2} requests \
         per pass; RSS start {:.0} MiB, end {:.0} MiB, max {:.0} MiB",
        args.clients,
        slots,
        soak_secs,
        args.model,
        row["strategy"],
        row["requests"],
        row["errors"],
        f("ttft_p50_s"),
        f("ttft_p99_s"),
        f("tpot_p50_s"),
        f("tpot_p99_s"),
        f("queue_wait_mean_s"),
        f("tokens_per_s"),
        f("requests_per_pass"),
        row["rss_mib_start"].as_f64().unwrap_or(0.0),
        row["rss_mib_end_of_soak"].as_f64().unwrap_or(0.0),
        row["rss_mib_max"].as_f64().unwrap_or(0.0),
    );
    if !row["verified"].is_null() {
        eprintln!("alone vs under load: {}", row["verified"]);
    }
    if !row["killed"].is_null() {
        eprintln!(
            "then {} clients left mid-stream: {}",
            args.kill, row["killed"]
        );
    }
    if args.json {
        println!("{row}");
    }
    line_chart(
        &LineChart {
            title: format!(
                "arbor serve under {} streaming clients ({})",
                args.clients, args.model
            ),
            x_label: "seconds".into(),
            y_label: "resident MiB / threads".into(),
            series: vec![
                LineSeries {
                    name: "resident MiB".into(),
                    points: samples.iter().map(|s| (s.0, s.1)).collect(),
                },
                LineSeries {
                    name: "threads".into(),
                    points: samples.iter().map(|s| (s.0, s.2)).collect(),
                },
            ],
        },
        &args.plot,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}

/// Each prompt the clients sent, asked again with nothing else running:
/// how many texts under load equal the text alone (greedy).
fn verify(
    addr: SocketAddr,
    model: &str,
    texts: &[String],
    max_tokens: usize,
    done: &[Done],
) -> Result<serde_json::Value> {
    idle(addr, Duration::from_secs(300));
    let mut asked: Vec<usize> = done.iter().map(|d| d.prompt).collect();
    asked.sort_unstable();
    asked.dedup();
    let mut bar = progress::count_bar("prompts asked again alone");
    let mut alone = std::collections::HashMap::new();
    for (i, &p) in asked.iter().enumerate() {
        bar(i, asked.len());
        let d = one(addr, model, &texts[p], max_tokens).map_err(anyhow::Error::msg)?;
        alone.insert(p, d.text);
    }
    bar(asked.len(), asked.len());
    let same = done.iter().filter(|d| alone[&d.prompt] == d.text).count();
    let differ: Vec<usize> = (done.iter())
        .filter(|d| alone[&d.prompt] != d.text)
        .map(|d| d.prompt)
        .collect();
    Ok(json!({"requests": done.len(), "same": same, "prompts": asked.len(), "differ": differ}))
}

/// `n` clients start streams and leave — half while queued, half after
/// some text; then the server must settle and serve again. Memory and
/// threads before and after.
fn leave(
    addr: SocketAddr,
    model: &str,
    texts: &[String],
    n: usize,
    max_tokens: usize,
    samples: &Samples,
    start: Instant,
) -> serde_json::Value {
    idle(addr, Duration::from_secs(120));
    let before = (sys::rss_bytes().unwrap_or(0), sys::threads().unwrap_or(0));
    let cancelled = metric(addr, "requests_cancelled_total").unwrap_or(0.0);
    let leavers: Vec<_> = (0..n)
        .map(|k| {
            let (model, text) = (model.to_string(), texts[k % texts.len()].clone());
            std::thread::spawn(move || {
                let body = json!({
                    "model": model, "max_tokens": 512, "stream": true,
                    "messages": [{"role": "user", "content": text}],
                });
                if let Ok(mut events) = Events::open(addr, "/v1/chat/completions", &body) {
                    // Every other client waits for some text first.
                    for _ in 0..(k % 2) * 3 {
                        events.next_data();
                    }
                }
            })
        })
        .collect();
    for l in leavers {
        let _ = l.join();
    }
    let settled = idle(addr, Duration::from_secs(300));
    let served_after = one(addr, model, &texts[0], max_tokens).is_ok();
    std::thread::sleep(Duration::from_secs(1));
    let after = (sys::rss_bytes().unwrap_or(0), sys::threads().unwrap_or(0));
    sample(samples, start);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    json!({
        "clients": n,
        "cancelled": metric(addr, "requests_cancelled_total").unwrap_or(0.0) - cancelled,
        "settled": settled,
        "served_after": served_after,
        "rss_mib_before": mib(before.0),
        "rss_mib_after": mib(after.0),
        "threads_before": before.1,
        "threads_after": after.1,
    })
}
