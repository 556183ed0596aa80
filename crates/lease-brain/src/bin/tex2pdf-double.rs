//! The tex2pdf **test double** as a process of its own, for several brain processes that must share one
//! "service" (end-to-end tests, demos). Not a LaTeX compiler: see [`lease_brain::tex2pdf_double`].
//!
//! Environment: `TEX2PDF_DOUBLE_LISTEN` (default `127.0.0.1:8090`), `TEX2PDF_DOUBLE_MAX_CONCURRENT` (jobs at once
//! above which a submit answers 429; default 6, `0` = unlimited), `TEX2PDF_DOUBLE_JOB_MS` (job duration, default
//! 1000). Prints its base URL on stdout once it listens (logs go to stderr); stops on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use lease_brain::tex2pdf_double::{self, DoubleConfig};
use tracing_subscriber::EnvFilter;

fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|_| format!("{name}={v:?} is not valid")),
        Err(_) => Ok(default),
    }
}

fn config() -> Result<(SocketAddr, DoubleConfig), String> {
    let listen: SocketAddr = var("TEX2PDF_DOUBLE_LISTEN", SocketAddr::from(([127, 0, 0, 1], 8090)))?;
    let max: usize = var("TEX2PDF_DOUBLE_MAX_CONCURRENT", 6)?;
    let job_ms: u64 = var("TEX2PDF_DOUBLE_JOB_MS", 1000)?;
    let config = DoubleConfig {
        max_concurrent: (max > 0).then_some(max),
        job_duration: Duration::from_millis(job_ms),
        ..DoubleConfig::default()
    };
    Ok((listen, config))
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let (listen, config) = match config() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let double = match tex2pdf_double::start(listen, config).await {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(%listen, error = %e, "could not listen");
            return ExitCode::FAILURE;
        }
    };
    tracing::warn!(
        url = double.base_url(),
        max_concurrent = ?config.max_concurrent,
        job_ms = u64::try_from(config.job_duration.as_millis()).unwrap_or(u64::MAX),
        "tex2pdf TEST DOUBLE listening (fake PDFs, no LaTeX)"
    );
    println!("{}", double.base_url());
    lease_brain::server::shutdown_signal().await;
    let stats = double.stats();
    double.shutdown().await;
    tracing::info!(?stats, "tex2pdf test double stopped");
    ExitCode::SUCCESS
}
