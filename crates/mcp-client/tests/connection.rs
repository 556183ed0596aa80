//! `McpConnection` and its session guard, against the real `@modelcontextprotocol/server-everything`.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::http::Method;
use lease_toolpack::{GuardError, TransportKind};
use mcp_client::{ConnectionConfig, HttpConfig, McpConnection, McpError, StdioConfig};
use support::{CountingGuard, EverythingHttp, RecordingProxy, echo_args, everything_stdio, free_port};

fn connection(transport: impl Into<mcp_client::TransportConfig>, guard: &CountingGuard) -> McpConnection {
    McpConnection::new(ConnectionConfig::new("everything", transport), Arc::new(guard.clone()))
}

async fn echo(conn: &McpConnection, text: &str) -> Result<String, McpError> {
    conn.call_tool("echo", echo_args(text)).await.map(|r| r.text())
}

#[tokio::test]
async fn stdio_guard_counts_open_after_initialize_check_close() {
    let guard = CountingGuard::default();
    let stdio = everything_stdio();
    let conn = connection(stdio.clone(), &guard);
    assert!(!conn.is_open().await);
    assert_eq!(guard.counts(), (0, 0, 0, 0), "nothing opens before the first call");

    let tools = conn.list_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "echo"));
    assert_eq!(guard.counts(), (1, 1, 0, 0), "tools/list opens but does not check");

    assert!(echo(&conn, "one").await.unwrap().contains("one"));
    assert!(echo(&conn, "two").await.unwrap().contains("two"));
    assert_eq!(guard.counts(), (1, 1, 2, 0), "one check per tools/call");

    let ctx = guard.0.contexts.lock().unwrap()[0].clone();
    assert_eq!(ctx.tool_name, "everything");
    assert_eq!(ctx.transport, TransportKind::Stdio);
    assert_eq!(ctx.endpoint, stdio.command_line());
    let info = guard.infos()[0].clone();
    assert_eq!(info.tool_name, "everything");
    assert_eq!(info.endpoint, stdio.command_line());
    assert_eq!(info.session_id, None);
    assert_eq!(info.transport, TransportKind::Stdio);

    conn.close().await.expect("close");
    assert_eq!(guard.counts(), (1, 1, 2, 1));
    conn.close().await.expect("close is idempotent");
    assert_eq!(guard.counts(), (1, 1, 2, 1), "a second close closes no guard");
    assert!(!conn.is_open().await);

    // The next call re-opens silently, with a new guard.open.
    assert!(echo(&conn, "three").await.unwrap().contains("three"));
    assert_eq!(guard.counts(), (2, 2, 3, 1));
    conn.close().await.unwrap();
    assert_eq!(guard.counts(), (2, 2, 3, 2));
}

#[tokio::test]
async fn http_guard_gets_the_session_id_and_close_sends_delete() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    let conn = connection(HttpConfig::new(proxy.endpoint()).bearer("conn-token"), &guard);

    assert!(echo(&conn, "hi").await.unwrap().contains("hi"));
    assert_eq!(guard.counts(), (1, 1, 1, 0));
    let session_id = conn.session_id().await.expect("session id");
    let info = guard.infos()[0].clone();
    assert_eq!(info.session_id.as_deref(), Some(session_id.as_str()));
    assert_eq!(info.endpoint, proxy.endpoint());
    assert_eq!(info.transport, TransportKind::StreamableHttp);

    conn.close().await.expect("close");
    assert_eq!(guard.counts(), (1, 1, 1, 1));
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].header("mcp-session-id"), Some(session_id.as_str()));
    assert_eq!(deletes[0].header("authorization"), Some("Bearer conn-token"));
}

#[tokio::test]
async fn a_server_that_exits_at_once_closes_the_guard_once() {
    let guard = CountingGuard::default();
    let conn = connection(StdioConfig::new(support::node(), ["-e", "process.exit(0)"]), &guard);
    let err = echo(&conn, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Closed(_) | McpError::Io(_)), "{err}");
    assert_eq!(guard.counts(), (1, 0, 0, 1));
    assert!(!conn.is_open().await);

    // Each attempt is a new session: open and close again.
    assert!(echo(&conn, "x").await.is_err());
    assert_eq!(guard.counts(), (2, 0, 0, 2));
}

#[tokio::test]
async fn a_missing_command_closes_the_guard_once() {
    let guard = CountingGuard::default();
    let conn = connection(StdioConfig::new("/nonexistent/mcp-server", Vec::<String>::new()), &guard);
    let err = conn.list_tools().await.unwrap_err();
    assert!(matches!(err, McpError::Spawn { .. }), "{err}");
    assert_eq!(guard.counts(), (1, 0, 0, 1));
}

#[tokio::test]
async fn a_closed_port_closes_the_guard_once() {
    let guard = CountingGuard::default();
    let conn = connection(HttpConfig::new(format!("http://127.0.0.1:{}/mcp", free_port())), &guard);
    let err = echo(&conn, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Http { .. }), "{err}");
    assert_eq!(guard.counts(), (1, 0, 0, 1));
}

#[tokio::test]
async fn a_refused_open_opens_no_transport() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    guard.0.refuse_open.store(true, Ordering::SeqCst);
    let conn = connection(HttpConfig::new(proxy.endpoint()), &guard);

    let err = echo(&conn, "x").await.unwrap_err();
    match &err {
        McpError::Guard(GuardError::Refused(r)) => assert_eq!(r.code, "LEASE_BUSY"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(guard.counts(), (1, 0, 0, 0), "a refused open has nothing to close");
    assert!(proxy.requests().is_empty(), "a refused open must not reach the server");

    // The refusal was for that attempt only.
    assert!(echo(&conn, "y").await.unwrap().contains('y'));
    assert_eq!(guard.counts(), (2, 1, 1, 0));
    conn.close().await.unwrap();
}

#[tokio::test]
async fn a_failing_after_initialize_closes_session_and_guard() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    guard.0.fail_after_initialize.store(true, Ordering::SeqCst);
    let conn = connection(HttpConfig::new(proxy.endpoint()).bearer("t"), &guard);

    let err = echo(&conn, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Guard(GuardError::Refused(_))), "{err}");
    assert_eq!(guard.counts(), (1, 1, 0, 1));
    assert!(!conn.is_open().await);
    let session_id = guard.infos()[0].session_id.clone().expect("session id");
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1, "the initialized session is terminated");
    assert_eq!(deletes[0].header("mcp-session-id"), Some(session_id.as_str()));
    assert_eq!(deletes[0].header("authorization"), Some("Bearer t"));
}

#[tokio::test]
async fn a_revoked_check_closes_the_session_and_the_next_call_opens_a_new_one() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    let conn = connection(HttpConfig::new(proxy.endpoint()).bearer("revoke-token"), &guard);

    assert!(echo(&conn, "before").await.unwrap().contains("before"));
    let first = conn.session_id().await.expect("first session id");
    assert_eq!(guard.counts(), (1, 1, 1, 0));

    guard.0.revoke_next_check.store(true, Ordering::SeqCst);
    let err = echo(&conn, "revoked").await.unwrap_err();
    assert!(err.is_revoked(), "expected SessionRevoked, got {err}");
    assert!(matches!(err, McpError::Guard(GuardError::Revoked(_))));
    assert_eq!(guard.counts(), (1, 1, 2, 1), "the revoked session's guard is closed");
    assert!(!conn.is_open().await);
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1, "the revoked session is terminated");
    assert_eq!(deletes[0].header("mcp-session-id"), Some(first.as_str()));
    assert_eq!(deletes[0].header("authorization"), Some("Bearer revoke-token"));
    let tools_calls_before = proxy.with_method(Method::POST).len();

    // The next call opens a new session with a new guard.
    assert!(echo(&conn, "after").await.unwrap().contains("after"));
    let second = conn.session_id().await.expect("second session id");
    assert_ne!(first, second);
    assert_eq!(guard.counts(), (2, 2, 3, 1));
    assert_eq!(guard.infos()[1].session_id.as_deref(), Some(second.as_str()));
    assert!(proxy.with_method(Method::POST).len() > tools_calls_before);

    conn.close().await.unwrap();
    assert_eq!(guard.counts(), (2, 2, 3, 2));
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 2);
    assert_eq!(deletes[1].header("mcp-session-id"), Some(second.as_str()));
}

#[tokio::test]
async fn a_refused_check_fails_the_call_but_keeps_the_session() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    let conn = connection(HttpConfig::new(proxy.endpoint()), &guard);

    assert!(echo(&conn, "a").await.is_ok());
    let session_id = conn.session_id().await.unwrap();
    guard.0.refuse_next_check.store(true, Ordering::SeqCst);
    let err = echo(&conn, "b").await.unwrap_err();
    match &err {
        McpError::Guard(GuardError::Refused(r)) => assert_eq!(r.code, "LEASE_UNAVAILABLE"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(guard.counts(), (1, 1, 2, 0));
    assert!(proxy.with_method(Method::DELETE).is_empty());
    assert!(echo(&conn, "c").await.unwrap().contains('c'));
    assert_eq!(conn.session_id().await.as_deref(), Some(session_id.as_str()));
    assert_eq!(guard.counts(), (1, 1, 3, 0));
    conn.close().await.unwrap();
}

#[tokio::test]
async fn close_if_token_closes_only_the_session_holding_it() {
    let guard = CountingGuard::default();
    let conn = connection(everything_stdio(), &guard);
    assert!(echo(&conn, "a").await.is_ok());

    assert!(!conn.close_if_token("tok-other").await.unwrap());
    assert!(conn.is_open().await);
    assert!(conn.close_if_token("tok-1").await.unwrap());
    assert!(!conn.is_open().await);
    assert_eq!(guard.counts(), (1, 1, 1, 1));

    // A delayed revocation of the old lease leaves the re-opened session alone.
    assert!(echo(&conn, "b").await.is_ok());
    assert!(!conn.close_if_token("tok-1").await.unwrap());
    assert!(conn.is_open().await);
    conn.close().await.unwrap();
    assert_eq!(guard.counts(), (2, 2, 2, 2));
}

#[tokio::test]
async fn a_dropped_connection_closes_its_session_in_the_background() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let guard = CountingGuard::default();
    let conn = connection(HttpConfig::new(proxy.endpoint()), &guard);
    assert!(echo(&conn, "a").await.is_ok());
    drop(conn);
    // Wait (without a time limit assertion) for the background close.
    while guard.counts().3 == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(guard.counts(), (1, 1, 1, 1));
    assert_eq!(proxy.with_method(Method::DELETE).len(), 1);
}
