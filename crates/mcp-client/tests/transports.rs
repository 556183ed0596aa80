//! `McpSession` over both transports against the real `@modelcontextprotocol/server-everything`.

mod support;

use axum::http::Method;
use mcp_client::{
    HttpConfig, McpError, McpSession, SUPPORTED_PROTOCOL_VERSIONS, SessionOptions, StdioConfig, TransportConfig,
    terminate_session,
};
use support::{EverythingHttp, RecordingProxy, echo_args, everything_stdio, free_port, session_status};

fn assert_has_echo(tools: &[mcp_client::Tool]) {
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"echo"), "tools/list lacks echo: {names:?}");
}

#[tokio::test]
async fn stdio_initialize_list_and_call_echo() {
    let config = TransportConfig::Stdio(everything_stdio());
    let session = McpSession::open(&config, &SessionOptions::default()).await.expect("open stdio session");

    let server = session.server();
    assert!(!server.server_info.name.is_empty());
    assert!(SUPPORTED_PROTOCOL_VERSIONS.contains(&server.protocol_version.as_str()));
    assert_eq!(session.session_id(), None);

    assert_has_echo(&session.list_tools().await.expect("tools/list"));

    let result = session.call_tool("echo", echo_args("hello over stdio")).await.expect("tools/call echo");
    assert!(!result.is_error);
    assert!(result.text().contains("hello over stdio"), "echo said {:?}", result.text());

    // A tool's own failure is a result (or an RPC error), not a transport failure; the session stays usable.
    match session.call_tool("no-such-tool", serde_json::Map::new()).await {
        Ok(r) => assert!(r.is_error),
        Err(e) => assert!(matches!(e, McpError::Rpc { .. }), "unexpected error {e}"),
    }
    assert!(session.call_tool("echo", echo_args("still there")).await.unwrap().text().contains("still there"));

    session.close().await.expect("close");
    session.close().await.expect("close is idempotent");
    let after = session.call_tool("echo", echo_args("x")).await.unwrap_err();
    assert!(matches!(after, McpError::Closed(_)), "after close: {after}");
}

#[tokio::test]
async fn stdio_missing_command_is_a_spawn_error() {
    let config = TransportConfig::Stdio(StdioConfig::new("/nonexistent/mcp-server", Vec::<String>::new()));
    let err = McpSession::open(&config, &SessionOptions::default()).await.unwrap_err();
    assert!(matches!(err, McpError::Spawn { .. }), "{err}");
}

#[tokio::test]
async fn stdio_server_that_exits_at_once_fails_the_handshake() {
    let config = TransportConfig::Stdio(StdioConfig::new(support::node(), ["-e", "process.exit(3)"]));
    let err = McpSession::open(&config, &SessionOptions::default()).await.unwrap_err();
    assert!(matches!(err, McpError::Closed(_) | McpError::Io(_)), "{err}");
}

#[tokio::test]
async fn http_initialize_list_call_and_delete_with_auth_on_close() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let config = HttpConfig::new(proxy.endpoint()).bearer("test-token-1").header("X-Tenant-Key", "key-1");
    let session =
        McpSession::open(&TransportConfig::Http(config), &SessionOptions::default()).await.expect("open http session");

    let session_id = session.session_id().expect("server-everything assigns a session id");
    let version = session.server().protocol_version.clone();
    assert!(SUPPORTED_PROTOCOL_VERSIONS.contains(&version.as_str()));

    assert_has_echo(&session.list_tools().await.expect("tools/list"));
    let result = session.call_tool("echo", echo_args("hello over http")).await.expect("tools/call echo");
    assert!(result.text().contains("hello over http"), "echo said {:?}", result.text());

    // Every POST carried the auth headers; every POST after initialize the session id and protocol version.
    let posts = proxy.with_method(Method::POST);
    assert!(posts.len() >= 4, "initialize, initialized, tools/list, tools/call: {posts:?}");
    for (i, post) in posts.iter().enumerate() {
        assert_eq!(post.header("authorization"), Some("Bearer test-token-1"), "POST #{i}");
        assert_eq!(post.header("x-tenant-key"), Some("key-1"), "POST #{i}");
        assert_eq!(post.path, "/mcp");
        let accept = post.header("accept").unwrap_or_default();
        assert!(accept.contains("application/json") && accept.contains("text/event-stream"), "POST #{i}: {accept}");
        if i == 0 {
            assert_eq!(post.header("mcp-session-id"), None, "initialize carries no session id");
        } else {
            assert_eq!(post.header("mcp-session-id"), Some(session_id.as_str()), "POST #{i}");
            assert_eq!(post.header("mcp-protocol-version"), Some(version.as_str()), "POST #{i}");
        }
    }
    assert!(proxy.with_method(Method::DELETE).is_empty());

    session.close().await.expect("close");
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    let delete = &deletes[0];
    assert_eq!(delete.path, "/mcp");
    assert_eq!(delete.header("mcp-session-id"), Some(session_id.as_str()));
    assert_eq!(delete.header("authorization"), Some("Bearer test-token-1"));
    assert_eq!(delete.header("x-tenant-key"), Some("key-1"));
    assert_eq!(session.session_id(), None);

    // Idempotent: no second DELETE; later requests fail locally.
    session.close().await.expect("second close");
    assert_eq!(proxy.with_method(Method::DELETE).len(), 1);
    let after = session.list_tools().await.unwrap_err();
    assert!(matches!(after, McpError::Closed(_)), "after close: {after}");

    // The server really forgot the session.
    let status = session_status(&server, &session_id).await;
    assert!(status.is_client_error(), "the server still serves the deleted session: {status}");
}

#[tokio::test]
async fn http_terminate_session_sends_delete_with_configured_auth() {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let config = HttpConfig::new(proxy.endpoint()).header("X-Api-Key", "api-key-7");
    let session = McpSession::open(&TransportConfig::Http(config.clone()), &SessionOptions::default()).await.unwrap();
    let session_id = session.session_id().unwrap();

    terminate_session(&config, &session_id).await.expect("terminate");
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].header("mcp-session-id"), Some(session_id.as_str()));
    assert_eq!(deletes[0].header("x-api-key"), Some("api-key-7"));
    assert!(session.list_tools().await.is_err(), "the terminated session still works");
}

#[tokio::test]
async fn http_connection_refused_is_an_http_error() {
    let config = HttpConfig::new(format!("http://127.0.0.1:{}/mcp", free_port()));
    let err = McpSession::open(&TransportConfig::Http(config), &SessionOptions::default()).await.unwrap_err();
    assert!(matches!(err, McpError::Http { method: "POST", .. }), "{err}");
}

#[tokio::test]
async fn http_error_status_is_reported() {
    let server = EverythingHttp::start().await;
    // server-everything serves only /mcp.
    let config = HttpConfig::new(format!("{}/elsewhere", server.base));
    let err = McpSession::open(&TransportConfig::Http(config), &SessionOptions::default()).await.unwrap_err();
    assert!(matches!(err, McpError::HttpStatus { status: 404, .. }), "{err}");
}
