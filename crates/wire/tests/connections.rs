//! `Connections` with several connections per node: each task keeps to one of them, tasks
//! spawned one after another are spread over all of them, and a closed one is replaced.
//! Connections open only between equal versions and matching credentials (token, TLS).
//! A server that stops serving answers every request it was sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tutti_wire::handshake::{hello, HELLO_BYTES, HELLO_VERSION_BYTES};
use tutti_wire::{
    ClusterToken, Connection, Connections, Credentials, Dialer, Request, Response, Tls,
    FRAME_BYTES_MAX_DEFAULT,
};

type Served = Arc<Mutex<Vec<tokio::task::AbortHandle>>>;

/// A server answering `Directory` with an empty one; hands out its connections' tasks.
async fn server() -> (String, Served) {
    server_with(Credentials::default()).await
}

/// `server`, asking its peers for `credentials`.
async fn server_with(credentials: Credentials) -> (String, Served) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let served = Served::default();
    let tasks = served.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let task = tokio::spawn(tutti_wire::serve_connection(
                stream,
                FRAME_BYTES_MAX_DEFAULT,
                credentials.clone(),
                tutti_wire::CancellationToken::new(),
                |id, _req, replies| {
                    let _ = replies.send((
                        id,
                        Response::Directory(tutti_wire::Directory {
                            nodes: Vec::new(),
                            epoch: 0,
                        }),
                    ));
                },
            ));
            tasks.lock().unwrap().push(task.abort_handle());
        }
    });
    (addr, served)
}

/// The connection a freshly spawned task gets, asked twice and used once.
async fn task_connection(conns: &Arc<Connections>, addr: &str) -> Arc<Connection> {
    let (conns, addr) = (conns.clone(), addr.to_string());
    tokio::spawn(async move {
        let first = conns.get(1, &addr).await.unwrap();
        let again = conns.get(1, &addr).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "one task, one connection");
        first.call(&Request::Directory).await.unwrap();
        first
    })
    .await
    .unwrap()
}

async fn setup(per_node: usize) -> (String, Served, Arc<Connections>) {
    let (addr, served) = server().await;
    let conns = Connections::with_per_node(
        FRAME_BYTES_MAX_DEFAULT,
        Duration::from_secs(1),
        per_node,
        Default::default(),
    );
    (addr, served, Arc::new(conns))
}

/// Until a node has its share of connections, each call opens one more.
async fn fill(conns: &Connections, addr: &str) {
    while conns.cached(1).is_none() {
        conns.get(1, addr).await.unwrap();
    }
}

#[tokio::test]
async fn each_task_keeps_to_one_connection_and_tasks_share_them_out() {
    let (addr, served, conns) = setup(2).await;
    fill(&conns, &addr).await;
    let mut seen: Vec<Arc<Connection>> = Vec::new();
    for _ in 0..6 {
        let c = task_connection(&conns, &addr).await;
        if !seen.iter().any(|s| Arc::ptr_eq(s, &c)) {
            seen.push(c);
        }
    }
    assert_eq!(seen.len(), 2, "consecutive tasks use both connections");
    assert_eq!(served.lock().unwrap().len(), 2);

    // The server drops both; the next calls open new ones.
    for task in served.lock().unwrap().drain(..) {
        task.abort();
    }
    while !seen.iter().all(|c| c.is_closed()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(conns.cached(1).is_none());
    fill(&conns, &addr).await;
    for _ in 0..4 {
        let c = task_connection(&conns, &addr).await;
        assert!(!seen.iter().any(|s| Arc::ptr_eq(s, &c)));
    }
    assert_eq!(served.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn one_connection_per_node_is_shared_by_every_task() {
    let (addr, served, conns) = setup(1).await;
    let first = task_connection(&conns, &addr).await;
    for _ in 0..4 {
        assert!(Arc::ptr_eq(&first, &task_connection(&conns, &addr).await));
    }
    assert_eq!(served.lock().unwrap().len(), 1);
}

/// What became of one call to a server that went away meanwhile.
#[derive(Debug, Default)]
struct Fates {
    answered: usize,
    refused: usize,
    not_sent: usize,
    lost: Vec<String>,
}

/// Callers keep a connection busy with calls a server answers a millisecond later, and the
/// server stops serving under them: each call is answered, refused unexecuted, or never
/// sent; none is left not knowing whether it ran (which made a transaction's outcome
/// unknown when a mirror was promoted under a client's retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answers_every_request_it_was_sent() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = tutti_wire::CancellationToken::new();
    let server = tokio::spawn(tutti_wire::serve_until(
        listener,
        FRAME_BYTES_MAX_DEFAULT,
        Credentials::default(),
        stop.clone(),
        |id, _req, replies| {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let dir = tutti_wire::Directory {
                    nodes: Vec::new(),
                    epoch: 0,
                };
                let _ = replies.send((id, Response::Directory(dir)));
            });
        },
    ));
    let conn = Arc::new(
        Connection::connect(&addr, FRAME_BYTES_MAX_DEFAULT, &Dialer::default())
            .await
            .unwrap(),
    );
    let fates = Arc::new(Mutex::new(Fates::default()));
    let callers: Vec<_> = (0..32)
        .map(|_| {
            let (conn, fates) = (conn.clone(), fates.clone());
            tokio::spawn(async move {
                loop {
                    let fate = conn.call(&Request::Directory).await;
                    let mut fates = fates.lock().unwrap();
                    match fate {
                        Ok(Response::Directory(_)) => fates.answered += 1,
                        Err(tutti_wire::RpcError::Remote {
                            code: tutti_wire::ErrorCode::NotReady,
                            ..
                        }) => fates.refused += 1,
                        Err(tutti_wire::RpcError::NotSent { .. }) => {
                            fates.not_sent += 1;
                            return;
                        }
                        other => fates.lost.push(format!("{other:?}")),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    for caller in callers {
        caller.await.unwrap();
    }
    let fates = std::mem::take(&mut *fates.lock().unwrap());
    assert!(fates.lost.is_empty(), "{fates:?}");
    assert!(fates.answered > 100, "{fates:?}");
    assert_eq!(fates.not_sent, 32, "{fates:?}");
    assert!(conn.is_closed());
    tokio::time::timeout(Duration::from_millis(500), server)
        .await
        .expect("the server returns once its connection closed")
        .unwrap();
}

/// A raw listener that opens every connection with `hello` and keeps the first
/// `HELLO_VERSION_BYTES` it is sent.
async fn raw_server(hello: Vec<u8>) -> (String, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (heard, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(&hello).await.unwrap();
        let mut got = vec![0; HELLO_VERSION_BYTES];
        stream.read_exact(&mut got).await.unwrap();
        heard.send(got).await.unwrap();
    });
    (addr, rx)
}

/// The hello of a build that speaks `version`, as every version starts it.
fn hello_of_version(version: u32) -> Vec<u8> {
    let mut theirs = hello(0, &[0; 16])[..HELLO_VERSION_BYTES].to_vec();
    theirs[8..].copy_from_slice(&version.to_le_bytes());
    theirs
}

#[tokio::test]
async fn a_peer_of_another_protocol_version_is_refused_naming_both() {
    let ours = tutti_wire::PROTOCOL_VERSION;
    let (addr, mut heard) = raw_server(hello_of_version(ours - 1)).await;
    let err = Connection::connect(&addr, FRAME_BYTES_MAX_DEFAULT, &Default::default())
        .await
        .err()
        .expect("refused");
    let message = err.to_string();
    assert!(
        message.contains(&format!("version {}", ours - 1))
            && message.contains(&format!("version {ours}")),
        "{message}"
    );
    assert_eq!(heard.recv().await.unwrap(), hello_of_version(ours));

    let (addr, _heard) = raw_server(b"HTTP/1.1 400".to_vec()).await;
    let err = Connection::connect(&addr, FRAME_BYTES_MAX_DEFAULT, &Default::default())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a tutti endpoint"), "{err}");
}

/// Everything a server sends to a raw connection that sends `bytes`, until it closes. A
/// server that closes with bytes unread resets the connection, after what it sent.
async fn answer_to(addr: &str, bytes: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut rest = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf));
        match read.await.expect("the server closes") {
            Ok(0) | Err(_) => return rest,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn a_server_answers_another_version_with_its_own_and_closes() {
    let (addr, _served) = server().await;
    let rest = answer_to(&addr, &hello_of_version(9)).await;
    assert_eq!(rest.len(), HELLO_BYTES, "the server's hello, then the end");
    assert_eq!(
        rest[..HELLO_VERSION_BYTES],
        hello_of_version(tutti_wire::PROTOCOL_VERSION)
    );
}

fn token(secret: &str) -> Credentials {
    Credentials {
        token: Some(ClusterToken::new(secret.as_bytes()).unwrap()),
        tls: None,
    }
}

/// Connects with `credentials` and asks for the directory.
async fn ask_with(addr: &str, credentials: &Credentials) -> Result<Response, tutti_wire::RpcError> {
    let dialer = Dialer::default().with_credentials(credentials.clone());
    let conn = Connection::connect(addr, FRAME_BYTES_MAX_DEFAULT, &dialer).await?;
    conn.call(&Request::Directory).await
}

/// Connects with the token `secret` (or none) and asks for the directory.
async fn ask(addr: &str, secret: Option<&str>) -> Result<Response, tutti_wire::RpcError> {
    ask_with(addr, &secret.map(token).unwrap_or_default()).await
}

#[tokio::test]
async fn a_server_with_a_token_serves_only_peers_that_prove_it() {
    let secret = "0123456789abcdef0123456789abcdef";
    let (addr, _served) = server_with(token(secret)).await;
    assert!(matches!(
        ask(&addr, Some(secret)).await,
        Ok(Response::Directory(_))
    ));
    let err = ask(&addr, None).await.unwrap_err().to_string();
    assert!(err.contains("requires the cluster token"), "{err}");
    let err = (ask(&addr, Some("0123456789abcdef0123456789abcdeX")).await)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token differs"), "{err}");

    let (open, _served) = server().await;
    let err = ask(&open, Some(secret)).await.unwrap_err().to_string();
    assert!(err.contains("presented no cluster token"), "{err}");
}

#[tokio::test]
async fn a_connection_without_the_token_hears_nothing_past_the_hello() {
    let secret = "0123456789abcdef0123456789abcdef";
    let (addr, _served) = server_with(token(secret)).await;
    let frame = tutti_wire::encode_envelope(1, &Request::Directory);
    let request = [&(frame.len() as u32).to_be_bytes()[..], &frame].concat();

    // No token: the server's hello, then the end; the request is never read.
    let rest = answer_to(&addr, &[&hello(0, &[7; 16])[..], &request].concat()).await;
    assert_eq!(rest.len(), HELLO_BYTES);
    assert_eq!(
        rest[HELLO_VERSION_BYTES] & 1,
        1,
        "the server asks for a token"
    );

    // A token claimed with a made-up proof: the hello and a refusal, never the server's proof.
    let claim = [&hello(1, &[7; 16])[..], &[0xab; 32], &request].concat();
    let rest = answer_to(&addr, &claim).await;
    assert_eq!(rest.len(), HELLO_BYTES + 1);
    assert_eq!(rest[HELLO_BYTES], 0, "refused");
}

/// A cluster authority and a certificate from it for 127.0.0.1, in `dir` as `name`.pem,
/// `name`.key and `name`-ca.pem, loaded.
fn tls(dir: &std::path::Path, name: &str) -> Arc<Tls> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use std::os::unix::fs::PermissionsExt;
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let path = |ext: &str| dir.join(format!("{name}{ext}"));
    std::fs::write(path(".pem"), cert.pem()).unwrap();
    std::fs::write(path(".key"), key.serialize_pem()).unwrap();
    std::fs::set_permissions(path(".key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(path("-ca.pem"), ca_cert.pem()).unwrap();
    Arc::new(Tls::load(&path(".pem"), &path(".key"), &path("-ca.pem")).unwrap())
}

fn with_tls(tls: &Arc<Tls>) -> Credentials {
    Credentials {
        token: None,
        tls: Some(tls.clone()),
    }
}

#[tokio::test]
async fn a_server_with_tls_serves_only_peers_with_a_certificate_of_its_authority() {
    let dir = tempfile::tempdir().unwrap();
    let ours = tls(dir.path(), "ours");
    let (addr, _served) = server_with(with_tls(&ours)).await;
    assert!(matches!(
        ask_with(&addr, &with_tls(&ours)).await,
        Ok(Response::Directory(_))
    ));
    let err = ask(&addr, None).await.unwrap_err().to_string();
    assert!(err.contains("requires TLS"), "{err}");
    let theirs = tls(dir.path(), "theirs");
    let err = (ask_with(&addr, &with_tls(&theirs)).await)
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS with the peer failed"), "{err}");

    // TLS to a server without it.
    let (open, _served) = server().await;
    let err = (ask_with(&open, &with_tls(&ours)).await)
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not speak TLS"), "{err}");
}

#[tokio::test]
async fn a_token_inside_tls_is_asked_for_as_well() {
    let dir = tempfile::tempdir().unwrap();
    let ours = tls(dir.path(), "ours");
    let secret = "0123456789abcdef0123456789abcdef";
    let both = Credentials {
        tls: Some(ours.clone()),
        ..token(secret)
    };
    let (addr, _served) = server_with(both.clone()).await;
    assert!(matches!(
        ask_with(&addr, &both).await,
        Ok(Response::Directory(_))
    ));
    let err = (ask_with(&addr, &with_tls(&ours)).await)
        .unwrap_err()
        .to_string();
    assert!(err.contains("requires the cluster token"), "{err}");
}
