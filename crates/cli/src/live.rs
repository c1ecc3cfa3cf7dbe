//! Generated text on stdout as it streams: confirmed text as it comes and,
//! on a terminal, the draft's provisional text after it, dimmed, redrawn
//! whenever it grows, is confirmed or is rolled back. When stdout is not a
//! terminal only confirmed text is written, so pipes get the output alone.

use std::io::{IsTerminal, Write};

use arbor_engine::TextEvent;

pub struct Live {
    out: std::io::Stdout,
    tty: bool,
    /// Terminal width in columns.
    width: usize,
    /// Column after the confirmed text (characters since the last newline).
    column: usize,
    /// Provisional text, as the events define it.
    provisional: String,
    /// Whether provisional text is on the screen now.
    drawn: bool,
}

/// Save the cursor, restore it and clear to the end of the screen, dim,
/// reset (ANSI/VT100).
const SAVE: &str = "\x1b7";
const RESTORE_AND_CLEAR: &str = "\x1b8\x1b[J";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

impl Live {
    pub fn new() -> Self {
        let out = std::io::stdout();
        let tty = out.is_terminal();
        Self {
            out,
            tty,
            width: terminal_width().unwrap_or(80),
            column: 0,
            provisional: String::new(),
            drawn: false,
        }
    }

    pub fn event(&mut self, event: TextEvent<'_>) {
        let mut piece = "";
        match event {
            TextEvent::Confirmed(text) => {
                piece = text;
                let n = text.chars().count();
                let cut = self
                    .provisional
                    .char_indices()
                    .nth(n)
                    .map_or(self.provisional.len(), |(i, _)| i);
                self.provisional.drain(..cut);
            }
            TextEvent::Provisional(text) => self.provisional.push_str(text),
            TextEvent::Rollback { chars } => {
                let keep = self.provisional.chars().count().saturating_sub(chars);
                let cut = self
                    .provisional
                    .char_indices()
                    .nth(keep)
                    .map_or(self.provisional.len(), |(i, _)| i);
                self.provisional.truncate(cut);
            }
        }
        let _ = self.draw(piece);
    }

    fn draw(&mut self, confirmed: &str) -> std::io::Result<()> {
        let mut out = self.out.lock();
        if !self.tty {
            out.write_all(confirmed.as_bytes())?;
            return out.flush();
        }
        if self.drawn {
            out.write_all(RESTORE_AND_CLEAR.as_bytes())?;
            self.drawn = false;
        }
        out.write_all(confirmed.as_bytes())?;
        match confirmed.rfind('\n') {
            Some(i) => self.column = confirmed[i + 1..].chars().count(),
            None => self.column += confirmed.chars().count(),
        }
        // Provisional text stays on the cursor's line (newlines shown as
        // ⏎), so restoring the saved cursor never lands on a scrolled line.
        let room = self
            .width
            .saturating_sub(self.column % self.width.max(1))
            .saturating_sub(1);
        let shown: String = self
            .provisional
            .chars()
            .map(|c| if c == '\n' { '⏎' } else { c })
            .filter(|c| !c.is_control())
            .take(room)
            .collect();
        if !shown.is_empty() {
            write!(out, "{SAVE}{DIM}{shown}{RESET}")?;
            self.drawn = true;
        }
        out.flush()
    }

    /// Clears any provisional text left on the screen.
    pub fn finish(&mut self) {
        self.provisional.clear();
        let _ = self.draw("");
    }
}

/// The terminal's width in columns, when stdout is one.
fn terminal_width() -> Option<usize> {
    // SAFETY: TIOCGWINSZ fills a winsize struct we own.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
}
