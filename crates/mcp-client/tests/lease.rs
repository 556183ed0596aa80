//! Lease-guarded MCP sessions: `LeaseGuard`, `McpPool`, tool configs through the layers and the `mcp` handler,
//! against the real `@modelcontextprotocol/server-everything` and the real MongoDB (`LEASE_TEST_MONGODB_URI`).

mod support;

use axum::http::Method;
use lease_shared::store::HolderRecord;
use lease_shared::{LeaseError, Level, RevocationReason};
use mcp_client::GuardError;
use mcp_client::{Caller, McpError, McpLeaseHandler, McpPool, McpRevocation};
use support::{EverythingHttp, RecordingProxy, World, echo_args, everything_entry, free_port, node, session_status};

fn http_tool(endpoint: &str, lease: &str) -> String {
    format!(
        "transport: streamable-http\nendpoint: {endpoint}\nheaders:\n  Authorization: Bearer tool-secret\n  \
         X-Api-Key: key-1\nlease: {lease}\n"
    )
}

fn stdio_tool(lease: &str) -> String {
    format!(
        "transport: stdio\ncommand: {}\nargs: [{:?}, stdio]\nlease: {lease}\n",
        node(),
        everything_entry().display().to_string()
    )
}

/// The tool `everything` over Streamable HTTP behind a recording proxy, under the bundled `browser` lease (user
/// cap 1, no wait), and a pool of pod `pod-a`. The server must live as long as the test.
async fn http_tool_on_pod_a(w: &World) -> (EverythingHttp, RecordingProxy, McpPool) {
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    w.browser_without_wait().await;
    w.tool("everything", &http_tool(&proxy.endpoint(), "browser")).await;
    (server, proxy, McpPool::new(w.leases.clone(), w.layers.clone(), "pod-a"))
}

async fn echo(pool: &McpPool, caller: &Caller, text: &str) -> Result<String, McpError> {
    pool.call_tool(caller, "everything", "echo", echo_args(text)).await.map(|r| r.text())
}

fn text<'a>(h: &'a HolderRecord, key: &str) -> Option<&'a str> {
    h.payload.get(key).and_then(|v| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_cap_one_refuses_a_second_session_of_the_same_user_and_admits_another_user() {
    let w = World::new("user_cap").await;
    let (_server, proxy, pool) = http_tool_on_pod_a(&w).await;
    let (u1_p1, u1_p2, u2_p1) =
        (Caller::new("t1", "p1", "u1"), Caller::new("t1", "p2", "u1"), Caller::new("t1", "p1", "u2"));

    assert!(echo(&pool, &u1_p1, "first").await.unwrap().contains("first"));
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    let h = &holders[0];
    let session_id = pool.connection(&u1_p1, "everything").await.unwrap().session_id().await.expect("session id");
    assert_eq!((h.lease_type.as_str(), h.lease.as_str(), h.resource.as_str()), ("mcp", "browser", "browser"));
    assert_eq!((h.pod.as_str(), h.pod_bound, h.user_id.as_deref()), ("pod-a", false, Some("u1")));
    assert_eq!(text(h, "toolName"), Some("everything"));
    assert_eq!(text(h, "endpoint"), Some(proxy.endpoint().as_str()));
    assert_eq!(text(h, "sessionId"), Some(session_id.as_str()));
    assert_eq!(text(h, "transport"), Some("streamable-http"));

    // The same user in another project: the user level counts tenant/user, across projects.
    let posts_before = proxy.with_method(Method::POST).len();
    let err = echo(&pool, &u1_p2, "second").await.unwrap_err();
    assert_eq!(err.code(), "LEASE_BUSY", "{err}");
    let McpError::Guard(GuardError::Refused(refused)) = &err else { panic!("expected a refusal: {err}") };
    assert!(refused.message.contains("level user"), "the diagnosis is in the message: {}", refused.message);
    match refused.cause_as::<LeaseError>() {
        Some(LeaseError::Busy(b)) => {
            assert_eq!((b.resource.as_str(), b.level, b.scope.as_str()), ("browser", Level::User, "t1/u1"));
            assert_eq!((b.count, b.cap), (1, 1));
        }
        other => panic!("expected the busy lease error as the cause, got {other:?}"),
    }
    assert_eq!(proxy.with_method(Method::POST).len(), posts_before, "a refused session never reaches the server");
    assert_eq!(w.holders().await.len(), 1);

    // Another user is admitted.
    assert!(echo(&pool, &u2_p1, "other user").await.unwrap().contains("other user"));
    assert_eq!(w.holders().await.len(), 2);
    assert_eq!(pool.len(), 3, "one entry per (tenant, project, user, tool), the refused one included");

    // Shutdown closes every session (DELETE with the configured auth) and releases every lease.
    pool.shutdown().await;
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    for d in &deletes {
        assert_eq!(d.header("authorization"), Some("Bearer tool-secret"));
        assert_eq!(d.header("x-api-key"), Some("key-1"));
    }
    assert!(deletes.iter().any(|d| d.header("mcp-session-id") == Some(session_id.as_str())));
    assert!(w.holders().await.is_empty(), "shutdown released the leases");
    assert!(matches!(echo(&pool, &u1_p1, "x").await, Err(McpError::Closed(_))), "a shut-down pool refuses use");
    assert!(pool.is_empty());
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_fails_the_next_call_and_the_call_after_opens_a_new_session_with_a_new_lease() {
    let w = World::new("revoked").await;
    let (server, proxy, pool) = http_tool_on_pod_a(&w).await;
    let caller = Caller::new("t1", "p1", "u1");

    assert!(echo(&pool, &caller, "before").await.is_ok());
    let first = w.holders().await.remove(0);
    let first_session = text(&first, "sessionId").unwrap().to_owned();

    // Revoked without a handler (an operator's revocation whose notification got lost): check-at-use notices.
    w.leases.reaper().revoke(&first.token, None).await.expect("revoke");
    let err = echo(&pool, &caller, "revoked").await.unwrap_err();
    assert!(err.is_revoked(), "expected the revoked-session error, got {err}");
    assert_eq!(err.code(), "LEASE_LOST");
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1, "the revoked session is closed");
    assert_eq!(deletes[0].header("mcp-session-id"), Some(first_session.as_str()));
    assert_eq!(deletes[0].header("authorization"), Some("Bearer tool-secret"));
    assert!(!session_status(&server, &first_session).await.is_success());

    // The call after that opens a new session with a new lease.
    assert!(echo(&pool, &caller, "after").await.unwrap().contains("after"));
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    let second_session = text(&holders[0], "sessionId").unwrap();
    assert_ne!(holders[0].token, first.token, "a new lease");
    assert_ne!(second_session, first_session, "a new session");
    assert_eq!(
        pool.connection(&caller, "everything").await.unwrap().session_id().await.as_deref(),
        Some(second_session)
    );
    pool.shutdown().await;
    assert!(w.holders().await.is_empty());
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_closes_the_pooled_session_holding_the_revoked_lease_and_not_a_reopened_one() {
    let w = World::new("handler_local").await;
    w.tool("everything", &stdio_tool("{name: solo, levels: {user: 1}, waitMs: 0}")).await;
    let pool = McpPool::new(w.leases.clone(), w.layers.clone(), "pod-a");
    let handler = McpLeaseHandler::new("pod-a", w.layers.clone());
    assert!(handler.attach_pool(pool.clone()));
    assert!(!handler.attach_pool(pool.clone()), "one pool per handler");
    let caller = Caller::new("t1", "p1", "u1");

    assert!(echo(&pool, &caller, "a").await.is_ok());
    let first = w.holders().await.remove(0);
    assert!(first.pod_bound, "a stdio server dies with its pod");
    assert_eq!(first.resource, "mcp-inline:t1/p1/solo", "an inline lease counts on a project-private resource");
    assert_eq!((text(&first, "transport"), text(&first, "sessionId")), (Some("stdio"), None));

    let revoked = w.leases.reaper().revoke(&first.token, None).await.unwrap();
    assert_eq!(handler.revoke(&revoked, RevocationReason::Revoke).await.unwrap(), McpRevocation::ClosedLocal);
    let conn = pool.connection(&caller, "everything").await.unwrap();
    assert!(!conn.is_open().await, "the handler closed the session");

    // The next call opens a new session at once (the revoked one is gone, so no revoked-session error).
    assert!(echo(&pool, &caller, "b").await.unwrap().contains('b'));
    let second = w.holders().await.remove(0);
    assert_ne!(second.token, first.token);

    // A late revocation of the first lease closes nothing: the re-opened session holds another lease.
    assert_eq!(handler.revoke(&revoked, RevocationReason::Idle).await.unwrap(), McpRevocation::NotHeld);
    assert!(conn.is_open().await);
    assert_eq!(w.holders().await.len(), 1);
    pool.shutdown().await;
    assert!(w.holders().await.is_empty());
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_pod_deletes_a_dead_pods_http_session_with_the_configured_auth_unless_the_tool_moved() {
    let w = World::new("handler_remote").await;
    let server = EverythingHttp::start().await;
    let proxy = RecordingProxy::start(&server.base).await;
    let moved_to = RecordingProxy::start(&server.base).await;
    w.browser_without_wait().await;
    w.tool("everything", &http_tool(&proxy.endpoint(), "browser")).await;
    // The sessions of a pod that is about to die: never closed by it.
    let dead = McpPool::new(w.leases.clone(), w.layers.clone(), "pod-dead");
    let reaper = McpLeaseHandler::new("pod-b", w.layers.clone());
    let (u1, u2) = (Caller::new("t1", "p1", "u1"), Caller::new("t1", "p1", "u2"));

    assert!(echo(&dead, &u1, "a").await.is_ok());
    let holder = w.holders().await.remove(0);
    let session_id = text(&holder, "sessionId").unwrap().to_owned();
    let revoked = w.leases.reaper().revoke(&holder.token, None).await.unwrap();
    let outcome = reaper.revoke(&revoked, RevocationReason::Pod).await.unwrap();
    assert_eq!(outcome, McpRevocation::Terminated { endpoint: proxy.endpoint() });
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].header("mcp-session-id"), Some(session_id.as_str()));
    assert_eq!(deletes[0].header("authorization"), Some("Bearer tool-secret"), "the configured auth");
    assert_eq!(deletes[0].header("x-api-key"), Some("key-1"));
    assert!(!session_status(&server, &session_id).await.is_success(), "the server forgot the session");
    // (Had the pod lived on, its next call would learn of the lost lease.)
    assert!(echo(&dead, &u1, "b").await.unwrap_err().is_revoked());
    // (That closed the dead pod's connection, with its own DELETE of the gone session.)
    let deletes = proxy.with_method(Method::DELETE).len();

    // The tool now points to another endpoint: the reaper sends nothing, to either endpoint.
    assert!(echo(&dead, &u2, "c").await.is_ok());
    let holder = w.holders().await.into_iter().find(|h| h.user_id.as_deref() == Some("u2")).unwrap();
    let session_id = text(&holder, "sessionId").unwrap().to_owned();
    w.tool("everything", &http_tool(&moved_to.endpoint(), "browser")).await;
    let revoked = w.leases.reaper().revoke(&holder.token, None).await.unwrap();
    let outcome = reaper.revoke(&revoked, RevocationReason::Pod).await.unwrap();
    assert!(matches!(&outcome, McpRevocation::Skipped(why) if why.contains("another endpoint")), "{outcome:?}");
    assert_eq!(proxy.with_method(Method::DELETE).len(), deletes, "no DELETE to the old endpoint");
    assert!(moved_to.requests().is_empty(), "nothing to the new endpoint");
    assert!(session_status(&server, &session_id).await.is_success(), "the session was left alone");

    // No tool config any more, a pod-bound holder, a session without id: nothing is sent either.
    let mut other = revoked.clone();
    other.tenant_id = "t-without-tools".into();
    assert!(matches!(reaper.revoke(&other, RevocationReason::Pod).await.unwrap(), McpRevocation::Skipped(_)));
    let mut bound = revoked.clone();
    bound.pod_bound = true;
    assert!(matches!(reaper.revoke(&bound, RevocationReason::Pod).await.unwrap(), McpRevocation::Skipped(_)));
    let mut early = revoked.clone();
    early.payload.remove("sessionId");
    assert!(matches!(reaper.revoke(&early, RevocationReason::Pod).await.unwrap(), McpRevocation::Skipped(_)));
    assert_eq!(proxy.with_method(Method::DELETE).len(), deletes);
    assert!(moved_to.requests().is_empty());

    // An unreadable tool config fails the handler (logged by the dispatcher), sending nothing.
    w.tool("everything", "transport: [").await;
    let err = reaper.revoke(&revoked, RevocationReason::Pod).await.unwrap_err();
    assert!(err.contains("tenant layer") && err.contains("is invalid"), "{err}");
    assert_eq!(proxy.with_method(Method::DELETE).len(), deletes);
    drop(dead);
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_acquire_returns_the_lease_at_once() {
    let w = World::new("failure_after_acquire").await;
    let pool = McpPool::new(w.leases.clone(), w.layers.clone(), "pod-a");
    let caller = Caller::new("t1", "p1", "u1");
    let lease = "{name: solo, levels: {user: 1}, waitMs: 0}";

    w.tool("everything", &http_tool(&format!("http://127.0.0.1:{}/mcp", free_port()), lease)).await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Http { .. }), "{err}");
    assert!(w.holders().await.is_empty(), "the lease was returned when the transport failed");

    w.tool("everything", &format!("transport: stdio\ncommand: /nonexistent/mcp-server\nlease: {lease}\n")).await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Spawn { .. }), "{err}");
    assert!(w.holders().await.is_empty(), "the lease was returned when the process did not start");

    w.tool(
        "everything",
        &format!("transport: stdio\ncommand: {}\nargs: ['-e', 'process.exit(3)']\nlease: {lease}\n", node()),
    )
    .await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert!(matches!(err, McpError::Closed(_) | McpError::Io(_)), "{err}");
    assert!(w.holders().await.is_empty(), "the lease was returned when the handshake failed");
    pool.shutdown().await;
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_configs_fail_closed_and_bad_lease_references_are_refused() {
    let w = World::new("config_errors").await;
    let pool = McpPool::new(w.leases.clone(), w.layers.clone(), "pod-a");
    let caller = Caller::new("t1", "p1", "u1");

    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert!(matches!(&err, McpError::UnknownTool { tool } if tool == "everything"), "{err}");
    assert_eq!(err.code(), "TOOL_NOT_FOUND");
    assert_eq!(pool.call_tool(&caller, "../x", "echo", echo_args("x")).await.unwrap_err().code(), "INVALID_REQUEST");

    // A broken project document is not replaced by the valid tenant document: fail-closed.
    w.tool("everything", &stdio_tool("none")).await;
    w.put("p1", "_vance/config/tools/everything.yaml", "transport: stdio\ncommand: x\nsurprise: 1\n").await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert_eq!(err.code(), "LEASE_UNAVAILABLE", "{err}");
    assert!(err.to_string().contains("project layer"), "{err}");

    // Lease rules the service owns: unknown names and inline fields a project may not set.
    w.put("p1", "_vance/config/tools/everything.yaml", &stdio_tool("no-such-lease")).await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert_eq!(err.code(), "INVALID_REQUEST", "{err}");
    w.put("p1", "_vance/config/tools/everything.yaml", &stdio_tool("{name: wide, levels: {global: 99}}")).await;
    let err = echo(&pool, &caller, "x").await.unwrap_err();
    assert_eq!(err.code(), "INVALID_REQUEST", "{err}");
    assert!(err.to_string().contains("levels.global"), "{err}");
    assert!(w.holders().await.is_empty());

    // `lease: none` opens the session without any lease.
    w.put("p1", "_vance/config/tools/everything.yaml", &stdio_tool("none")).await;
    assert!(echo(&pool, &caller, "free").await.unwrap().contains("free"));
    assert!(w.holders().await.is_empty());
    pool.shutdown().await;
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_follows_a_tool_config_change_and_invalidation_closes_with_delete() {
    let w = World::new("config_change").await;
    let server = EverythingHttp::start().await;
    let (first, second) = (RecordingProxy::start(&server.base).await, RecordingProxy::start(&server.base).await);
    w.browser_without_wait().await;
    w.tool("everything", &http_tool(&first.endpoint(), "browser")).await;
    let pool = McpPool::new(w.leases.clone(), w.layers.clone(), "pod-a");
    let caller = Caller::new("t1", "p1", "u1");

    assert!(echo(&pool, &caller, "a").await.is_ok());
    let old = w.holders().await.remove(0);
    w.tool("everything", &http_tool(&second.endpoint(), "browser")).await;
    // The user cap of 1 holds across the change: the old session's lease is returned before the new one opens.
    assert!(echo(&pool, &caller, "b").await.unwrap().contains('b'));
    assert_eq!(first.with_method(Method::DELETE).len(), 1, "the old session was terminated");
    assert_eq!(first.with_method(Method::DELETE)[0].header("mcp-session-id"), text(&old, "sessionId"));
    let holders = w.holders().await;
    assert_eq!(holders.len(), 1);
    assert_eq!(text(&holders[0], "endpoint"), Some(second.endpoint().as_str()));
    assert_eq!(pool.len(), 1);

    assert!(pool.invalidate(&caller, "everything").await.unwrap());
    assert!(!pool.invalidate(&caller, "everything").await.unwrap());
    assert_eq!(second.with_method(Method::DELETE).len(), 1);
    assert!(w.holders().await.is_empty());
    assert!(pool.is_empty());
    w.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_unless_a_call_holds_them() {
    let w = World::new("close_idle").await;
    let (_server, proxy, pool) = http_tool_on_pod_a(&w).await;
    let caller = Caller::new("t1", "p1", "u1");

    assert!(echo(&pool, &caller, "a").await.is_ok());
    let session = w.holders().await.remove(0);
    assert_eq!(pool.close_idle(std::time::Duration::from_secs(600)).await, 0, "used just now");
    assert_eq!(w.holders().await.len(), 1);

    // A caller that holds the connection (as a call under way does) keeps it, however idle the entry.
    let held = pool.connection(&caller, "everything").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(pool.close_idle(std::time::Duration::ZERO).await, 0, "closed under a running call");
    assert!(held.is_open().await);
    drop(held);

    // Idle and unused: closed with the session DELETE, its lease released, the entry gone.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(pool.close_idle(std::time::Duration::from_millis(20)).await, 1);
    assert!(pool.is_empty());
    let deletes = proxy.with_method(Method::DELETE);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].header("mcp-session-id"), text(&session, "sessionId"));
    assert!(w.holders().await.is_empty(), "the lease was not released");
    // The next use opens a new session with a new lease.
    assert!(echo(&pool, &caller, "b").await.unwrap().contains('b'));
    let again = w.holders().await;
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].token, session.token);
    pool.shutdown().await;
    w.drop_db().await;
}
