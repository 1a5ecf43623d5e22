//! `Connections` with several connections per node: each task keeps to one of them, tasks
//! spawned one after another are spread over all of them, and a closed one is replaced.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tutti_wire::{Connection, Connections, Request, Response, FRAME_BYTES_MAX_DEFAULT};

type Served = Arc<Mutex<Vec<tokio::task::AbortHandle>>>;

/// A server answering `Directory` with an empty one; hands out its connections' tasks.
async fn server() -> (String, Served) {
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

/// A raw listener that opens every connection with `hello` and keeps what it is sent.
async fn raw_server(hello: Vec<u8>) -> (String, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (heard, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(&hello).await.unwrap();
        let mut got = vec![0; tutti_wire::handshake::HELLO_BYTES];
        stream.read_exact(&mut got).await.unwrap();
        heard.send(got).await.unwrap();
    });
    (addr, rx)
}

#[tokio::test]
async fn a_peer_of_another_protocol_version_is_refused_naming_both() {
    let mut theirs = tutti_wire::handshake::hello().to_vec();
    theirs[8..].copy_from_slice(&7u32.to_le_bytes());
    let (addr, mut heard) = raw_server(theirs).await;
    let err = Connection::connect(&addr, FRAME_BYTES_MAX_DEFAULT, &Default::default())
        .await
        .err()
        .expect("refused");
    let message = err.to_string();
    assert!(
        message.contains("version 7")
            && message.contains(&format!("version {}", tutti_wire::PROTOCOL_VERSION)),
        "{message}"
    );
    assert_eq!(heard.recv().await.unwrap(), tutti_wire::handshake::hello());

    let (addr, _heard) = raw_server(b"HTTP/1.1 400".to_vec()).await;
    let err = Connection::connect(&addr, FRAME_BYTES_MAX_DEFAULT, &Default::default())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not a tutti endpoint"), "{err}");
}

#[tokio::test]
async fn a_server_answers_another_version_with_its_own_and_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _served) = server().await;
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut ours = tutti_wire::handshake::hello();
    ours[8..].copy_from_slice(&9u32.to_le_bytes());
    stream.write_all(&ours).await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert_eq!(
        rest,
        tutti_wire::handshake::hello(),
        "the server's hello, then the end"
    );
}
