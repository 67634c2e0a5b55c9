//! The `service` binary run as a user runs it: an environment holding
//! nothing of the developer's shell, and servers started on a free port
//! and waited for until `/healthz` answers.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_service");

/// How long a server may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `service` with an empty environment except `PATH`, and no input.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).stdin(Stdio::null());
    cmd
}

/// A running `service serve`, killed when dropped. Its standard output
/// and error are collected, so a test can read what it printed.
pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub base: String,
    output: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

impl ServerProcess {
    /// Starts `service serve` with `env` on a free port and waits until it
    /// answers; panics with what it printed if it exits or does not answer.
    /// Blocks: async tests use [`ServerProcess::start`].
    pub fn start_blocking<K: AsRef<OsStr>, V: AsRef<OsStr>>(env: impl IntoIterator<Item = (K, V)>) -> ServerProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = command();
        cmd.env("SERVICE_BIND", format!("127.0.0.1:{port}")).env("SERVICE_LOG", "warn");
        cmd.envs(env);
        let mut child =
            cmd.arg("serve").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start the service binary");
        let output = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), output.clone()),
            collect(child.stderr.take().unwrap(), output.clone()),
        ];
        let mut server = ServerProcess { child, base: format!("http://127.0.0.1:{port}"), output, readers };
        server.wait_until_ready(port);
        server
    }

    /// [`ServerProcess::start_blocking`] off the async runtime's threads.
    pub async fn start(env: Vec<(&'static str, String)>) -> ServerProcess {
        tokio::task::spawn_blocking(move || ServerProcess::start_blocking(env)).await.unwrap()
    }

    fn wait_until_ready(&mut self, port: u16) {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the server exited with {status} before answering:\n{}", self.stop_and_collect());
            }
            if healthz_answers(port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not answer within {START_TIMEOUT:?}:\n{}", self.stop_and_collect());
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server has printed so far (standard output and error).
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// What the server has printed once `needle` is among it (or after
    /// five seconds, whatever it printed by then).
    pub fn output_containing(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = self.output();
            if out.contains(needle) || Instant::now() > deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server at once (as a crash would) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server and returns everything it printed.
    pub fn stop_and_collect(&mut self) -> String {
        self.kill();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        self.output()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Copies `from` into `into` until it closes.
fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}

/// Whether `GET /healthz` on `port` answers 200 (plain blocking HTTP, so
/// it works inside or outside an async runtime).
fn healthz_answers(port: u16) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}
