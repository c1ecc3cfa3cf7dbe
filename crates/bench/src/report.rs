//! How benchmarks print: a markdown table, or JSON lines with the table on
//! stderr, under one title line that says what ran.

use anyhow::Result;

/// The table on stdout; with `json`, one JSON object per row on stdout and
/// the table on stderr.
pub fn print_results<T: serde::Serialize>(table: &str, rows: &[T], json: bool) -> Result<()> {
    if json {
        eprint!("{table}");
        for r in rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        print!("{table}");
    }
    Ok(())
}

/// The first line of a speculative-decoding table (without the line
/// break): what ran.
pub fn title(prompts: usize, set: &str, max_tokens: usize, target: &str, draft: &str) -> String {
    format!(
        "{prompts} prompts from {set}, {max_tokens} new tokens, greedy, target {target} / draft {draft}"
    )
}
