//! The brain over real HTTP on loopback.

use std::time::Duration;

use lease_brain::BrainConfig;

#[tokio::test]
async fn brain_serves_health_readiness_and_metrics_and_shuts_down_gracefully() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = BrainConfig::from_env(|k| (k == "BRAIN_LISTEN").then(|| format!("127.0.0.1:{port}"))).unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(lease_brain::server::run(config, async {
        let _ = stop_rx.await;
    }));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut up = false;
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the brain never answered");
    assert_eq!(http.get(format!("{base}/readyz")).send().await.unwrap().status(), 200);
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("graceful shutdown").unwrap().unwrap();
    assert!(http.get(format!("{base}/healthz")).send().await.is_err(), "still serving after shutdown");
}

#[test]
fn bundled_tex_definition_parses() {
    let defs = lease_brain::server::bundled_definitions().unwrap();
    let tex = defs.iter().find(|d| d.name == "tex").expect("tex is bundled");
    assert_eq!(tex.resource, "tex2pdf");
    assert_eq!((tex.levels.global, tex.levels.tenant, tex.levels.project), (Some(6), Some(3), Some(1)));
}
