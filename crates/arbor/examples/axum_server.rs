//! arbor's OpenAI-compatible routes inside an axum application of one's
//! own: nested under `/llm`, beside a route of the application.
//!
//! `cargo run --release -p arbor --example axum_server -- [MODEL] [--once]`
//! serves on 127.0.0.1:8080 until stopped; with `--once` it binds a free
//! port, asks itself one chat completion, prints it and exits.

use arbor_serve::axum::{Router, routing::get};
use arbor_serve::{ServeOptions, embed, loaded};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let once = args.iter().any(|a| a == "--once");
    let model = (args.iter().find(|a| !a.starts_with("--")).cloned())
        .unwrap_or_else(|| "smollm2-135m".into());

    let session = arbor::Builder::new().model(model).max_tokens(16).build()?;
    let (llm, worker) = embed(
        loaded(session.into_run()?),
        ServeOptions {
            model_id: Some("local".into()),
            ..ServeOptions::default()
        },
    )?;
    // The worker takes the run over on its thread.
    let phase = tokio::task::block_in_place(|| worker.wait_loaded());
    assert_eq!(phase, arbor_serve::Phase::Ready);
    let app = Router::new()
        .route(
            "/",
            get(|| async { "my app; the model is under /llm/v1\n" }),
        )
        .nest("/llm", llm);

    let listener = tokio::net::TcpListener::bind(if once {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:8080"
    })
    .await?;
    let addr = listener.local_addr()?;
    eprintln!("listening on http://{addr}");
    if !once {
        arbor_serve::axum::serve(listener, app).await?;
        return Ok(());
    }
    let server = tokio::spawn(async move { arbor_serve::axum::serve(listener, app).await });
    let body =
        r#"{"model":"local","messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}"#;
    let response = post(addr, "/llm/v1/chat/completions", body).await?;
    println!("{response}");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"chat.completion\""), "{response}");
    server.abort();
    let _ = server.await;
    // The router is gone with the server: the worker ends.
    worker.join()?;
    Ok(())
}

/// One HTTP/1.1 POST on a fresh connection; the whole response.
async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}
