//! Rendering a model's own Jinja chat template.
//!
//! Models published with Hugging Face transformers describe their prompt
//! format as a Jinja template, which transformers renders with Python's
//! jinja2 and GGUF conversions copy into `tokenizer.chat_template`. Running
//! that template (with minijinja) rather than re-implementing each format by
//! hand keeps arbor's prompts identical to the ones the model was trained on,
//! default system messages and odd whitespace included. The environment is
//! set up the way transformers sets up jinja2:
//! - `trim_blocks` and `lstrip_blocks` are on, `{% break %}` and
//!   `{% continue %}` work, output is never HTML-escaped;
//! - Python methods on strings, dicts and lists (`.strip()`,
//!   `.startswith()`, `.split()`, `.items()`, ...) come from
//!   minijinja-contrib's `pycompat` layer;
//! - the context holds `messages` (a list of `{role, content}`),
//!   `add_generation_prompt` (always true: arbor renders prompts to generate
//!   from), `bos_token` and `eos_token`; `tools` and `documents` stay
//!   undefined, which templates treat as "no tools";
//! - `raise_exception(msg)` fails the render with `msg`, `strftime_now(fmt)`
//!   gives the current date, and `tojson` writes JSON the way Python's
//!   `json.dumps` does (`", "` and `": "` separators, non-ASCII kept, no
//!   HTML escaping) rather than minijinja's HTML-safe form.

use std::fmt;
use std::panic::AssertUnwindSafe;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, StringInput, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, context};

use crate::{ChatMessage, Result, TokenizerError};

/// Instructions one render may run: enough for conversations far past any
/// context (Qwen2.5's template renders 10,000 messages on it); a template from a hostile file that loops for ever
/// (two nested `range(100000)` loops are 10^10 steps) stops here with an
/// error instead of hanging its caller.
const FUEL: u64 = 5_000_000;

/// Bytes a render may write besides a multiple of its messages: a prompt
/// is the messages plus a little markup per message, so 16 MiB over four
/// times the conversation is far past any context window. Fuel counts
/// instructions, not output: one `{{ messages * 2**62 }}` prints a lazily
/// repeated list in one step, which filled the memory of the machine the
/// fuzzer ran on before this bound.
const OUTPUT_SLACK: usize = 16 << 20;

/// The name the template is stored under in its environment (shows up in
/// render errors as `(in chat_template:LINE)`).
const NAME: &str = "chat_template";

/// What a template may refer to besides the messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TemplateTokens {
    /// Text of the BOS token, empty when the vocabulary has none.
    pub bos: String,
    /// Text of the EOS token, empty when the vocabulary has none.
    pub eos: String,
    /// Whether [`crate::Tokenizer::encode`] prepends BOS itself, in which
    /// case a BOS written by the template is removed from the prompt.
    pub add_bos: bool,
}

/// A compiled chat template with the tokens it renders with.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    tokens: TemplateTokens,
    /// The source reads `tools` (and so lays out tool definitions and calls
    /// itself).
    tools: bool,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; fails on a syntax error or a construct minijinja
    /// does not support.
    pub(crate) fn compile(source: &str, tokens: TemplateTokens) -> Result<Self, Error> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?;
        env.set_syntax(syntax.clone());
        env.set_fuel(Some(FUEL));
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_formatter(|out, state, value| {
            shallow_enough(value)?;
            minijinja::escape_formatter(out, state, value)
        });
        env.add_filter("string", string);
        env.add_filter("pprint", pprint);
        env.add_filter("join", join);
        env.add_function(guard::STORED, guard::stored);
        env.add_filter(guard::STORED, guard::stored);
        let guarded = guard::guard_namespace_sets(source, &syntax)?;
        env.add_template_owned(NAME, guarded)?;
        let tools = source.contains("tools");
        Ok(Self { env, tokens, tools })
    }

    pub(crate) fn renders_tools(&self) -> bool {
        self.tools
    }

    /// The prompt for `messages`, ending with the template's generation
    /// prefix (the assistant header).
    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<String> {
        let text: usize = (messages.iter())
            .map(|m| {
                m.content.len()
                    + m.tool_calls
                        .iter()
                        .map(|c| c.arguments.len())
                        .sum::<usize>()
            })
            .sum();
        let defined: usize = tools.iter().map(|t| t.to_string().len()).sum();
        let cap = OUTPUT_SLACK.saturating_add((text + defined).saturating_mul(4));
        let messages: Vec<Value> = messages.iter().map(crate::tools::message_value).collect();
        let ctx = context! {
            messages,
            add_generation_prompt => true,
            bos_token => self.tokens.bos.as_str(),
            eos_token => self.tokens.eos.as_str(),
        };
        // `tools` stays undefined without any, which templates read as "no
        // tools".
        let ctx = match tools.is_empty() {
            true => ctx,
            false => context! { tools => Value::from(minijinja::value::Serde(tools)), ..ctx },
        };
        // minijinja can panic on values a template computes (2.24 did on
        // `9223372036854775807 * [1]`, overflowing a length);
        // a template comes from the model file, so that is the template's
        // error, not the caller's crash.
        let mut sink = Bounded {
            out: Vec::new(),
            cap,
            full: false,
        };
        let rendered = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let template = self.env.get_template(NAME)?;
            template.render_captured_to(ctx, &mut sink).map(|_| ())
        }))
        .map_err(|panic| {
            let why = (panic.downcast_ref::<String>().map(String::as_str))
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            TokenizerError::ChatTemplate(format!("the template engine failed: {why}"))
        })?;
        if let Err(e) = rendered {
            if sink.full {
                return Err(TokenizerError::ChatTemplate(format!(
                    "the template wrote more than {} bytes",
                    sink.cap
                )));
            }
            return Err(render_error(e));
        }
        // minijinja writes whole `str`s and a write is taken whole or not
        // at all, so the bytes are UTF-8.
        let mut out = String::from_utf8(sink.out)
            .map_err(|_| TokenizerError::ChatTemplate("the template wrote invalid UTF-8".into()))?;
        // Templates for models that start with BOS usually write
        // `{{ bos_token }}` themselves; when `encode` adds BOS too the prompt
        // would start with two, so the template's one is dropped (as
        // llama.cpp does).
        let bos = self.tokens.bos.as_str();
        if self.tokens.add_bos && !bos.is_empty() && out.starts_with(bos) {
            out.drain(..bos.len());
        }
        Ok(out)
    }
}

/// Nesting a printed or serialized value may have.
const MAX_DEPTH: usize = 64;

/// Items a printed or serialized value may hold, all levels together (each
/// prints as at least a byte, and a prompt is far smaller).
const MAX_ITEMS: usize = 1 << 20;

/// Refuses a value nested deeper than [`MAX_DEPTH`] or holding more than
/// [`MAX_ITEMS`] items before it is printed or serialized: both recurse per
/// level. Checked where a value is printed (`{{ }}`), serialized (`tojson`)
/// or turned into text by a filter (`string`, `pprint`, `join`). What a
/// namespace stores is bounded where it is stored ([`guard`]), so no value
/// holds itself.
fn shallow_enough(value: &Value) -> Result<(), Error> {
    fn walk(v: &Value, depth: usize, items: &mut usize) -> Result<(), Error> {
        use minijinja::value::ValueKind;
        if !matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::Plain
        ) {
            return Ok(());
        }
        if depth >= MAX_DEPTH {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("a value nested over {MAX_DEPTH} deep"),
            ));
        }
        let Ok(iter) = v.try_iter() else {
            return Ok(());
        };
        let is_map = v.kind() == ValueKind::Map;
        for item in iter {
            *items += 1;
            if *items > MAX_ITEMS {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("a value of over {MAX_ITEMS} items"),
                ));
            }
            if is_map && let Ok(inner) = v.get_item(&item) {
                walk(&inner, depth + 1, items)?;
            }
            walk(&item, depth + 1, items)?;
        }
        Ok(())
    }
    walk(value, 0, &mut 0)
}

/// minijinja's `string` filter, on a value [`shallow_enough`] to print.
fn string(state: &State, value: &Value) -> Result<Value, Error> {
    shallow_enough(value)?;
    minijinja::filters::string(state, value)
}

/// minijinja's `pprint` filter, on a value [`shallow_enough`] to print.
fn pprint(value: &Value) -> Result<String, Error> {
    shallow_enough(value)?;
    Ok(minijinja::filters::pprint(value))
}

/// minijinja's `join` filter, on a value [`shallow_enough`] to print.
fn join(
    state: &mut State,
    value: &Value,
    joiner: Option<StringInput<'_>>,
    attribute: Option<&str>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    shallow_enough(value)?;
    minijinja::filters::join(state, value, joiner, attribute, kwargs)
}

/// The render's output, refusing to grow past `cap` bytes (the write fails
/// and minijinja stops the render with an error).
struct Bounded {
    out: Vec<u8>,
    cap: usize,
    full: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len().saturating_add(buf.len()) > self.cap {
            self.full = true;
            return Err(std::io::Error::other("output bound"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Marks an error raised by the template's own `raise_exception`, so it can
/// be told apart from a failure of the template machinery.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// `raise_exception(msg)`: templates call it to refuse a conversation (roles
/// that do not alternate, an unknown role, ...).
fn raise_exception(msg: Value) -> Result<Value, Error> {
    let msg = msg.to_string();
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

fn render_error(e: Error) -> TokenizerError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if let Some(Raised(msg)) = c.downcast_ref::<Raised>() {
            return TokenizerError::ChatTemplateRejected(msg.clone());
        }
        cause = c.source();
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    TokenizerError::ChatTemplate(text)
}

/// The widest `tojson` indent: real templates use 2 or 4; a huge one
/// (from a hostile file) would ask for that many spaces per level.
const MAX_INDENT: usize = 1024;

/// `tojson(value, indent=None, ensure_ascii=False)` with the output of
/// Python's `json.dumps`, which is what the templates were written against:
/// `{"a": 1, "b": [1, 2]}` on one line, or `indent` spaces per level.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    if let Some(n) = indent.filter(|&n| n > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent {n} is over {MAX_INDENT}"),
        ));
    }
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    shallow_enough(value)?;

    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let spaces = " ".repeat(n);
            let f = serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes());
            serde::Serialize::serialize(
                value,
                &mut serde_json::Serializer::with_formatter(&mut out, f),
            )
        }
        None => serde::Serialize::serialize(
            value,
            &mut serde_json::Serializer::with_formatter(&mut out, crate::tools::PythonSeparators),
        ),
    };
    written.map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot write value as JSON").with_source(e)
    })?;
    let text = String::from_utf8(out).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "JSON output is not UTF-8").with_source(e)
    })?;
    Ok(Value::from(if ensure_ascii {
        escape_non_ascii(&text)
    } else {
        text
    }))
}

/// `\uXXXX` escapes (UTF-16, as JSON wants) for every non-ASCII character.
/// Such characters only occur inside JSON strings, so this is safe on whole
/// documents.
fn escape_non_ascii(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// `strftime_now(fmt)`: the current time, in UTC (arbor has no time zone
/// database), formatted with a subset of strftime: `%Y %y %m %d %e %j %H %I
/// %M %S %p %b %B %h %a %A %F %%`. Other directives are left as written
/// (as glibc, under Python, does). Templates use it for a "today's date"
/// line (`%d %b %Y`, `%Y-%m-%d`).
fn strftime_now(fmt: &str) -> String {
    format_time(fmt, jiff::Timestamp::now().as_second())
}

/// The directives [`format_time`] formats; any other is left as written.
const DIRECTIVES: &str = "YymdejHIMSpbBhaAF%";

/// `fmt` applied to `secs` seconds after the Unix epoch (UTC), by jiff's
/// strftime on the directives in [`DIRECTIVES`].
pub(crate) fn format_time(fmt: &str, secs: i64) -> String {
    let mut escaped = String::with_capacity(fmt.len() + 8);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            escaped.push(c);
            continue;
        }
        match chars.next() {
            Some(d) if DIRECTIVES.contains(d) => {
                escaped.push('%');
                escaped.push(d);
            }
            Some(other) => {
                escaped.push_str("%%");
                escaped.push(other);
            }
            None => escaped.push_str("%%"),
        }
    }
    let time = jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    jiff::fmt::strtime::format(escaped.as_str(), time).unwrap_or_else(|_| fmt.to_owned())
}

mod guard;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fuzz;
