//! Fake providers: real HTTPS servers on loopback, with certificates from a
//! test CA, reached by the server through the operator's egress overrides
//! (a pinned address per name and an extra trusted root) so the production
//! policy code runs unchanged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority for one test.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "service test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        TestCa { issuer: Issuer::new(params, key), pem }
    }

    /// A server certificate for `names`, signed by this CA.
    fn server_config(&self, names: &[&str]) -> ServerConfig {
        let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key).unwrap()
    }
}

/// A loopback port and TLS (HTTP/1.1) with a certificate of `ca` for
/// `names`.
async fn tls_listener(ca: &TestCa, names: &[&str]) -> (tokio::net::TcpListener, SocketAddr, TlsAcceptor) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = ca.server_config(names);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (listener, addr, TlsAcceptor::from(Arc::new(config)))
}

/// A running fake provider.
pub struct FakeProvider {
    pub addr: SocketAddr,
    /// Requests received (any path).
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeProvider {
    /// Serves `router` over HTTPS for `names` on a loopback port.
    pub async fn start(ca: &TestCa, names: &[&str], router: Router) -> FakeProvider {
        let (listener, addr, acceptor) = tls_listener(ca, names).await;
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let router = router.layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    next.run(req).await
                }
            },
        ));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { break };
                let acceptor = acceptor.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        FakeProvider { addr, hits, task }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// `name=addr` entries for the egress pin setting.
    pub fn pins(&self, names: &[&str]) -> String {
        names.iter().map(|n| format!("{n}={}", self.addr)).collect::<Vec<_>>().join(",")
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTPS front for a plain-HTTP server on loopback (such as a store's
/// reference implementation that speaks only HTTP): TLS with a certificate
/// of the test CA for `names`, every byte passed through unchanged.
pub struct TlsFront {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    pub async fn start(ca: &TestCa, names: &[&str], backend: SocketAddr) -> TlsFront {
        let (listener, addr, acceptor) = tls_listener(ca, names).await;
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { break };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // Passed on as it comes: a TLS record or an answer's
                    // tail must not wait for an ACK (Nagle's algorithm).
                    let _ = tcp.set_nodelay(true);
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else { return };
                    let _ = plain.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { addr, task }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
