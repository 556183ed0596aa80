//! A browser session (spec §7, "Browser Session") end to end: the real `@playwright/mcp` over stdio, driving
//! Debian's Chromium, behind a lease of user cap 1 on the real MongoDB (`LEASE_TEST_MONGODB_URI`).
//!
//! `@playwright/mcp` comes from `LEASE_MCP_PLAYWRIGHT` (its `cli.js`) or `scripts/mcp-servers.sh playwright-path`,
//! Chromium from `LEASE_CHROMIUM` (default `/usr/bin/chromium`); Playwright never downloads a browser here. Without
//! them the test fails with the install command (it never skips).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mcp_client::{Caller, McpPool};
use support::World;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TITLE: &str = "Lease Browser Test Page";
/// How long the browser's processes may take to go away after the session closed.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

fn playwright_entry() -> PathBuf {
    let path = match std::env::var("LEASE_MCP_PLAYWRIGHT") {
        Ok(path) => PathBuf::from(path),
        Err(_) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp-servers.sh");
            let out = std::process::Command::new(&script).arg("playwright-path").output();
            match out {
                Ok(out) if out.status.success() => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
                _ => PathBuf::new(),
            }
        }
    };
    assert!(
        path.is_file(),
        "\n\n@playwright/mcp is not installed (LEASE_MCP_PLAYWRIGHT={:?}). Install it (needs node + npm) with:\n\n    \
         scripts/mcp-servers.sh\n\nand set LEASE_MCP_PLAYWRIGHT=$(scripts/mcp-servers.sh playwright-path) (or unset it).\n",
        path.display().to_string()
    );
    path
}

fn chromium() -> PathBuf {
    let path = PathBuf::from(std::env::var("LEASE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned()));
    assert!(
        path.is_file(),
        "\n\nChromium is not installed at {}. Install Debian's chromium with:\n\n    scripts/chromium.sh\n\nand set \
         LEASE_CHROMIUM to the path it prints.\n",
        path.display()
    );
    path
}

/// Serves one fixed HTML page (title [`TITLE`]) on loopback, for any path; returns its URL.
async fn serve_page() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind page server");
    let addr = listener.local_addr().expect("page server addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!("<!doctype html><html><head><title>{TITLE}</title></head><body>hi</body></html>");
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    format!("http://{addr}/page.html")
}

/// The command lines of the processes (other than this one) whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) && e.file_name() != *me)
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmd| cmd.contains(marker))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_session_navigates_refuses_a_second_one_and_leaves_no_browser_behind() {
    let (entry, chromium) = (playwright_entry(), chromium());
    let World { db, store, layers, leases } = World::new("browser").await;

    // A private directory: its path is the marker of this test's server and browser processes.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("lease-browser-test-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("test dir");
    let marker = dir.display().to_string();
    let config = serde_json::json!({ "browser": {
        "browserName": "chromium",
        "userDataDir": dir.join("profile"),
        "launchOptions": {
            "executablePath": chromium,
            "headless": true,
            "chromiumSandbox": false,
            "args": ["--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-quic", "--no-first-run"],
        },
    }});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config.json");
    let args = [entry, dir.join("config.json"), dir.join("out")].map(|p| format!("{:?}", p.display().to_string()));
    let tool = format!(
        "transport: stdio\ncommand: {}\nargs: [{}, --config, {}, --output-dir, {}]\ncwd: {:?}\nlease: browser\n",
        support::node(),
        args[0],
        args[1],
        args[2],
        marker
    );
    // The bundled `browser` lease (user cap 1), without its 5 s wait.
    layers
        .put_document("t1", "_tenant", "_vance/config/lease/browser.yaml", "name: browser\nwaitMs: 0\n")
        .await
        .unwrap();
    layers.put_document("t1", "_tenant", "_vance/config/tools/browser.yaml", &tool).await.unwrap();
    let pool = McpPool::new(leases, layers, "pod-a");
    let (u1_p1, u1_p2) = (Caller::new("t1", "p1", "u1"), Caller::new("t1", "p2", "u1"));
    let url = serve_page().await;

    let tools = pool.list_tools(&u1_p1, "browser").await.expect("tools/list");
    assert!(
        tools.iter().any(|t| t.name == "browser_navigate"),
        "{:?}",
        tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let mut navigate = serde_json::Map::new();
    navigate.insert("url".to_owned(), serde_json::Value::from(url.as_str()));
    let result = pool.call_tool(&u1_p1, "browser", "browser_navigate", navigate).await.expect("browser_navigate");
    assert!(!result.is_error && result.text().contains(TITLE), "{result:?}");
    let holders = store.holders(None).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!((holders[0].resource.as_str(), holders[0].pod_bound), ("browser", true));
    let held = store.counters(Some("browser")).await.unwrap();
    assert!(held.iter().any(|c| c.count == 1), "the lease counts one session: {held:?}");
    let running = processes_with(&marker);
    assert!(running.iter().any(|c| c.contains("chromium")), "no chromium of this test runs: {running:?}");
    let servers = |procs: Vec<String>| procs.into_iter().filter(|c| c.contains("cli.js")).count();
    assert_eq!(servers(running), 1);

    // The same user (another project): refused by the lease before a server (let alone a browser) starts.
    let err = pool.list_tools(&u1_p2, "browser").await.unwrap_err();
    assert_eq!(err.code(), "LEASE_BUSY", "{err}");
    assert_eq!(servers(processes_with(&marker)), 1, "a refused session starts no server");

    // Closing the session releases the lease, and the browser goes with its server.
    assert!(pool.invalidate(&u1_p1, "browser").await.expect("close"));
    assert!(store.holders(None).await.unwrap().is_empty());
    let counters = store.counters(Some("browser")).await.unwrap();
    assert!(counters.iter().all(|c| c.count == 0), "{counters:?}");
    let started = Instant::now();
    let mut left = processes_with(&marker);
    while !left.is_empty() && started.elapsed() < EXIT_LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = processes_with(&marker);
    }
    assert!(left.is_empty(), "still running {EXIT_LIMIT:?} after the session closed: {left:?}");

    pool.shutdown().await;
    let _ = db.drop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
