//! What this process holds: resident memory and threads (Linux).

fn status_field(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size of this process (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    arbor_engine::peak_resident()
}

/// Resets the peak RSS counter so the next measurement covers only what
/// follows (Linux ≥ 4.0; a no-op elsewhere).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Resident set size of this process now (Linux), in bytes.
pub fn rss_bytes() -> Option<u64> {
    status_field("VmRSS:")
}

/// Threads of this process now (Linux).
pub fn threads() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Threads:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
