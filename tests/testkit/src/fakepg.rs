//! A fake PostgreSQL server that speaks just enough of the wire protocol
//! (v3) to see what a client would hand a server it does not know: whether
//! it asks for TLS, its startup parameters (user, database, options), and
//! the password it sends when asked for one in clear text. It then refuses
//! the login.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one connection showed.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub asked_for_tls: bool,
    pub startup: HashMap<String, String>,
    /// `None` when the client never sent one.
    pub password: Option<String>,
}

pub struct FakePostgres {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakePostgres {
    pub async fn start() -> FakePostgres {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut s = Seen::default();
                    let _ = talk(&mut conn, &mut s).await;
                    log.lock().unwrap().push(s);
                });
            }
        });
        FakePostgres { addr, seen, task }
    }

    pub fn connections(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakePostgres {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_message(conn: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let len = conn.read_i32().await? as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    conn.read_exact(&mut body).await?;
    Ok(body)
}

async fn talk(conn: &mut tokio::net::TcpStream, s: &mut Seen) -> std::io::Result<()> {
    let mut first = read_message(conn).await?;
    // SSLRequest: the code 80877103 and nothing else. No TLS here.
    if first.len() == 4 && i32::from_be_bytes(first[..4].try_into().unwrap()) == 80_877_103 {
        s.asked_for_tls = true;
        conn.write_all(b"N").await?;
        first = read_message(conn).await?;
    }
    // StartupMessage: protocol version, then name\0value\0 pairs.
    let fields: Vec<String> = first[4..].split(|b| *b == 0).map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    for pair in fields.chunks(2) {
        if let [k, v] = pair
            && !k.is_empty()
        {
            s.startup.insert(k.clone(), v.clone());
        }
    }
    // AuthenticationCleartextPassword.
    conn.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).await?;
    let tag = conn.read_u8().await?;
    if tag == b'p' {
        let body = read_message(conn).await?;
        s.password = Some(String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body)).into_owned());
    }
    let mut error = vec![b'S'];
    error.extend_from_slice(b"FATAL\0C28P01\0Mpassword authentication failed\0\0");
    let mut msg = vec![b'E'];
    msg.extend_from_slice(&((error.len() + 4) as i32).to_be_bytes());
    msg.extend_from_slice(&error);
    conn.write_all(&msg).await?;
    Ok(())
}
