//! The stdio transport: a child process speaking newline-delimited JSON-RPC on stdin/stdout.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::McpError;
use crate::jsonrpc::{self, Incoming, RpcErrorBody};

/// How long [`StdioTransport::close`] waits for the server to exit after its stdin is closed before killing it.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How many of the server's last stderr lines an error message quotes.
const STDERR_TAIL_LINES: usize = 20;
/// How long one quoted stderr line may be.
const STDERR_LINE_MAX: usize = 500;

/// How to start a stdio MCP server.
#[derive(Clone, PartialEq, Eq)]
pub struct StdioConfig {
    /// The program (a path, or a name looked up in `PATH`).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the child inherits this process's environment).
    pub env: Vec<(String, String)>,
    /// The working directory; this process's if `None`.
    pub cwd: Option<PathBuf>,
}

impl StdioConfig {
    /// Runs `command` with `args`.
    pub fn new(command: impl Into<String>, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        StdioConfig {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The command line, as the session's endpoint: the command and its arguments, space separated.
    pub fn command_line(&self) -> String {
        std::iter::once(self.command.as_str()).chain(self.args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
    }
}

impl fmt::Debug for StdioConfig {
    /// Environment values may hold secrets: only their names are shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdioConfig")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .finish()
    }
}

type Responder = oneshot::Sender<Result<Value, RpcErrorBody>>;

#[derive(Default)]
struct Pending {
    /// Why the transport is closed; `None` while it is open.
    closed: Option<String>,
    /// Requests waiting for their response, by id.
    waiting: HashMap<u64, Responder>,
}

struct Shared {
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pending: Mutex<Pending>,
    stderr_tail: Mutex<VecDeque<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Marks the transport closed (the first reason wins) and fails every waiting request.
    fn shut(&self, reason: String) {
        let waiting = {
            let mut p = lock(&self.pending);
            p.closed.get_or_insert(reason);
            std::mem::take(&mut p.waiting)
        };
        // Dropping the responders wakes the waiters, who then read the reason.
        drop(waiting);
    }

    fn closed_reason(&self) -> String {
        lock(&self.pending).closed.clone().unwrap_or_else(|| "the transport is closed".to_owned())
    }

    fn stderr_tail(&self) -> String {
        let tail = lock(&self.stderr_tail);
        if tail.is_empty() {
            String::new()
        } else {
            format!("; last stderr lines: {}", tail.iter().cloned().collect::<Vec<_>>().join(" | "))
        }
    }

    async fn write(&self, message: &Value) -> Result<(), McpError> {
        let mut line = message.to_string();
        line.push('\n');
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else {
            return Err(McpError::Closed(self.closed_reason()));
        };
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }
}

/// Removes a waiting request when its caller stops waiting (response, error, timeout or cancellation).
struct WaitingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.pending).waiting.remove(&self.id);
    }
}

/// A running stdio MCP server. Requests may be sent concurrently; responses are matched by id.
pub(crate) struct StdioTransport {
    shared: Arc<Shared>,
    child: tokio::sync::Mutex<Option<Child>>,
    tasks: Vec<JoinHandle<()>>,
    next_id: AtomicU64,
}

impl StdioTransport {
    /// Starts the server. The child is killed when the transport is dropped.
    pub(crate) fn spawn(config: &StdioConfig) -> Result<Self, McpError> {
        if config.command.trim().is_empty() {
            return Err(McpError::InvalidConfig("the stdio command is empty".to_owned()));
        }
        let mut cmd = Command::new(&config.command);
        cmd.args(&config.args)
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn().map_err(|source| McpError::Spawn { command: config.command_line(), source })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(McpError::Spawn {
                command: config.command_line(),
                source: std::io::Error::other("the child's stdio pipes are missing"),
            });
        };
        let shared = Arc::new(Shared {
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            pending: Mutex::new(Pending::default()),
            stderr_tail: Mutex::new(VecDeque::new()),
        });
        let command = config.command_line();
        let tasks = vec![
            tokio::spawn(read_stdout(stdout, shared.clone())),
            tokio::spawn(read_stderr(stderr, shared.clone(), command)),
        ];
        Ok(StdioTransport { shared, child: tokio::sync::Mutex::new(Some(child)), tasks, next_id: AtomicU64::new(1) })
    }

    /// Sends a request and waits for its response (no timeout here: the session applies one).
    pub(crate) async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = lock(&self.shared.pending);
            if let Some(reason) = &p.closed {
                return Err(McpError::Closed(reason.clone()));
            }
            p.waiting.insert(id, tx);
        }
        let _waiting = WaitingGuard { shared: &self.shared, id };
        self.shared.write(&jsonrpc::request(id, method, params)).await?;
        match rx.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(e.into_error(method)),
            Err(_) => Err(McpError::Closed(self.shared.closed_reason())),
        }
    }

    /// Sends a notification.
    pub(crate) async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        if let Some(reason) = &lock(&self.shared.pending).closed {
            return Err(McpError::Closed(reason.clone()));
        }
        self.shared.write(&jsonrpc::notification(method, params)).await
    }

    /// Closes the server's stdin, waits briefly for it to exit, then kills it. Idempotent.
    pub(crate) async fn close(&self) {
        self.shared.shut("the session was closed by the client".to_owned());
        // A writer stuck on a full pipe holds the lock; then the kill below unblocks it.
        if let Ok(mut stdin) = tokio::time::timeout(EXIT_GRACE, self.shared.stdin.lock()).await {
            stdin.take();
        }
        if let Some(mut child) = self.child.lock().await.take() {
            match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
                Ok(Ok(status)) => tracing::debug!(%status, "stdio MCP server exited"),
                Ok(Err(e)) => tracing::debug!(error = %e, "waiting for the stdio MCP server failed"),
                Err(_) => {
                    tracing::debug!("stdio MCP server did not exit after stdin was closed; killing it");
                    if let Err(e) = child.kill().await {
                        tracing::warn!(error = %e, "could not kill the stdio MCP server");
                    }
                }
            }
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Reads the server's messages until its output ends; answers its requests, routes responses to their waiters.
async fn read_stdout(stdout: impl AsyncRead + Unpin, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    let reason = loop {
        buf.clear();
        let limit = jsonrpc::MAX_MESSAGE_BYTES as u64 + 1;
        match (&mut reader).take(limit).read_until(b'\n', &mut buf).await {
            Ok(0) => break "the server closed its output (exited?)".to_owned(),
            Ok(_) if buf.len() > jsonrpc::MAX_MESSAGE_BYTES => {
                break format!("the server sent a message longer than {} bytes", jsonrpc::MAX_MESSAGE_BYTES);
            }
            Ok(_) => {}
            Err(e) => break format!("reading from the server failed: {e}"),
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let messages = match jsonrpc::parse(line) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "ignoring a line from the stdio MCP server");
                continue;
            }
        };
        for message in messages {
            match message {
                Incoming::Response { id, outcome } => {
                    let responder = id.as_u64().and_then(|id| lock(&shared.pending).waiting.remove(&id));
                    match responder {
                        Some(tx) => {
                            let _ = tx.send(outcome);
                        }
                        None => tracing::debug!(%id, "response to no waiting request"),
                    }
                }
                Incoming::Request { id, method } => {
                    let answer = jsonrpc::answer_server_request(id, &method);
                    if let Err(e) = shared.write(&answer).await {
                        tracing::debug!(error = %e, %method, "could not answer a server request");
                    }
                }
                Incoming::Notification { method } => tracing::trace!(%method, "server notification"),
            }
        }
    };
    let reason = format!("{reason}{}", shared.stderr_tail());
    tracing::debug!(%reason, "stdio MCP transport closed");
    shared.shut(reason);
}

/// Logs the server's stderr and keeps its last lines for error messages.
async fn read_stderr(stderr: impl AsyncRead + Unpin, shared: Arc<Shared>, command: String) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        tracing::debug!(target: "mcp_client::stderr", %command, "{line}");
        let mut tail = lock(&shared.stderr_tail);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(jsonrpc::excerpt(line).chars().take(STDERR_LINE_MAX).collect());
    }
}
