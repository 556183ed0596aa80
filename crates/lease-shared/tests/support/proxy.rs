//! A TCP forwarder in front of the test MongoDB that can be cut: a server that stops answering, without stopping
//! the shared mongod.

#![allow(unreachable_pub)]

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards connections on a loopback port to `target` until dropped or [`CutProxy::cut`].
pub struct CutProxy {
    pub addr: SocketAddr,
    acceptor: JoinHandle<()>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
}

impl CutProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let conns = connections.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(conn);
            }
        });
        CutProxy { addr, acceptor, connections }
    }

    /// Closes the port and every forwarded connection: the server is gone.
    pub fn cut(&self) {
        self.acceptor.abort();
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
