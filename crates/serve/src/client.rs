//! A plain blocking HTTP/1.1 client for talking to an `arbor serve` on
//! loopback: whole responses, and server-sent events read as they arrive
//! (what the tests and `arbor bench serve` need, with no client stack of
//! their own). One connection per request (`Connection: close`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A response: status, lower-cased headers, body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<BufReader<TcpStream>> {
    let mut s = TcpStream::connect(addr)?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    let typed = (headers.iter()).any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    if !body.is_empty() && !typed {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body.as_bytes())?;
    Ok(BufReader::new(s))
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The status line and headers.
fn head(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = (line.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').ok_or_else(|| bad("bad header"))?;
        headers.push((k.trim().to_lowercase(), v.trim().to_string()));
    }
    Ok((status, headers))
}

fn chunked(headers: &[(String, String)]) -> bool {
    (headers.iter()).any(|(k, v)| k == "transfer-encoding" && v == "chunked")
}

/// One chunk of a chunked body; `None` at its end (or a cut connection).
fn chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim(), 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data).ok()?;
    data.truncate(size);
    Some(data)
}

/// One request, its whole response.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Response> {
    let mut r = send(addr, method, path, headers, body)?;
    let (status, headers) = head(&mut r)?;
    let mut bytes = Vec::new();
    if chunked(&headers) {
        while let Some(c) = chunk(&mut r) {
            bytes.extend(c);
        }
    } else {
        r.read_to_end(&mut bytes)?;
    }
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// Server-sent events as they arrive; dropping it closes the connection.
pub struct Events {
    pub status: u16,
    reader: BufReader<TcpStream>,
    buffer: String,
}

impl Events {
    /// POSTs `body` to `path` and reads the response's head.
    pub fn open(addr: SocketAddr, path: &str, body: &serde_json::Value) -> std::io::Result<Self> {
        let mut reader = send(addr, "POST", path, &[], &body.to_string())?;
        let (status, _) = head(&mut reader)?;
        Ok(Self {
            status,
            reader,
            buffer: String::new(),
        })
    }

    /// The next event's `data`; `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = (event.lines())
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(data.join("\n"));
            }
            let c = chunk(&mut self.reader)?;
            self.buffer.push_str(&String::from_utf8_lossy(&c));
        }
    }

    /// Every remaining event's data.
    pub fn rest(mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_data()).collect()
    }
}

/// A metric's value from `/metrics`, if the server reports it.
pub fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let text = http(addr, "GET", "/metrics", &[], "").ok()?.body;
    (text.lines())
        .find_map(|l| l.strip_prefix(&format!("arbor_{name} ")))
        .and_then(|v| v.parse().ok())
}
