//! gRPC from outside: the tonic example run as a process (`--listen`), and a gRPC client
//! written by hand on HTTP/2 frames, with its own reading of `google.rpc.Status`, so that a
//! check does not rest on this crate's or tonic's encoding.
#![allow(dead_code, unreachable_pub)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant, SystemTime},
};

use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request};

/// The tonic example serving on a free loopback port (`--listen 127.0.0.1:0`), killed by PID
/// and reaped on drop, so also when a test panics.
pub struct TonicExample {
    child: Child,
    /// The address from its `listening on http://ADDR` line.
    pub addr: SocketAddr,
    /// Its stdout, line by line; closed at its end.
    stdout: mpsc::Receiver<String>,
}

impl TonicExample {
    pub fn start() -> Self {
        let bin = example_bin_up_to_date("tonic");
        let mut child = Command::new(&bin)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Owned by the guard at once, so the process is killed on every path.
        let mut example = TonicExample {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            stdout: rx,
        };
        let first = example
            .stdout
            .recv_timeout(Duration::from_secs(30))
            .expect("the tonic example printed no line within 30 s");
        let addr = first
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("first line is not `listening on http://ADDR`: {first:?}"));
        example.addr = addr.parse().unwrap_or_else(|e| panic!("{addr:?}: {e}"));
        assert_ne!(
            example.addr.port(),
            0,
            "the bound port, not the one asked for"
        );
        example
    }

    /// Stops it as an operator would (SIGTERM), after checking that it was still running:
    /// how it exited, and the lines it printed on stdout after the first.
    pub fn stop(&mut self) -> (ExitStatus, Vec<String>) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the example exited before it was stopped"
        );
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(killed, "kill -TERM {} failed", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "still running 30 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = Vec::new();
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_secs(30)) {
            rest.push(line);
        }
        (status, rest)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for TonicExample {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/<profile>/examples/<name>`, which must be newer than the example and the library
/// it links: `cargo test --test NAME` does not rebuild examples, and an old binary would test
/// old code.
fn example_bin_up_to_date(name: &str) -> std::path::PathBuf {
    let bin = super::example_bin(name);
    let built = modified(&bin);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("examples").join(format!("{name}.rs"))];
    let mut dirs = vec![root.join("src"), root.join("lua")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                sources.push(path);
            }
        }
    }
    for source in sources {
        assert!(
            modified(&source) <= built,
            "{} is older than {}: run `cargo build --example {name}` (or `cargo test`, which builds the examples)",
            bin.display(),
            source.display()
        );
    }
    bin
}

/// Runs example `name` with `args` and no input until it exits (killed after 30 s, which
/// fails): whether it succeeded, its stdout and its stderr.
pub fn run_example(name: &str, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(example_bin_up_to_date(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} {args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A gRPC client on a bare HTTP/2 connection (the `h2` crate): it writes the request headers
/// and the length-prefixed message itself and reads the response's headers, messages and
/// trailers as they come.
pub struct RawGrpcClient {
    authority: String,
    send: h2::client::SendRequest<Bytes>,
}

/// What came back for one call.
#[derive(Debug)]
pub struct RawResponse {
    /// HTTP status (200 for any gRPC answer).
    pub status: u16,
    /// The response headers: in a trailers-only response, `grpc-status` and the rest are here.
    pub headers: HeaderMap,
    /// The messages of the body, each without its 5-byte prefix.
    pub messages: Vec<Bytes>,
    /// The trailers, when the response had a body part.
    pub trailers: Option<HeaderMap>,
}

impl RawResponse {
    /// `name` from the trailers, or from the headers of a trailers-only response.
    pub fn grpc(&self, name: &str) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get(name))
            .or_else(|| self.headers.get(name))
            .map(|v| v.to_str().expect("an ASCII gRPC field"))
    }
}

impl RawGrpcClient {
    pub async fn connect(addr: SocketAddr) -> Self {
        let tcp =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .expect("connect timed out")
                .expect("connect");
        let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        RawGrpcClient {
            authority: addr.to_string(),
            send,
        }
    }

    /// A unary call of `path` with one message and `metadata` (ASCII name-value pairs).
    pub async fn unary(
        &mut self,
        path: &str,
        metadata: &[(&str, &str)],
        message: &[u8],
    ) -> RawResponse {
        let mut request = Request::post(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in metadata {
            request = request.header(*name, *value);
        }
        let request = request.body(()).unwrap();
        // One message: not compressed (0), its length as 4 bytes big-endian, its bytes.
        let mut frame = BytesMut::with_capacity(5 + message.len());
        frame.put_u8(0);
        frame.put_u32(u32::try_from(message.len()).unwrap());
        frame.put_slice(message);

        let call = async {
            let send = self.send.clone().ready().await.expect("connection ready");
            self.send = send;
            let (response, mut body) = self.send.send_request(request, false).expect("request");
            body.send_data(frame.freeze(), true).expect("request body");
            let response = response.await.expect("response headers");
            let (head, mut recv) = response.into_parts();
            let mut data = BytesMut::new();
            while let Some(chunk) = recv.data().await {
                let chunk = chunk.expect("response body");
                let _ = recv.flow_control().release_capacity(chunk.len());
                data.extend_from_slice(&chunk);
            }
            let trailers = recv.trailers().await.expect("response trailers");
            RawResponse {
                status: head.status.as_u16(),
                headers: head.headers,
                messages: split_messages(data.freeze()),
                trailers,
            }
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call took over 10 s")
    }
}

/// The messages of a gRPC body: each a flag byte, a 4-byte big-endian length and its bytes.
fn split_messages(mut data: Bytes) -> Vec<Bytes> {
    let mut messages = Vec::new();
    while data.has_remaining() {
        assert!(data.len() >= 5, "a cut message prefix: {data:?}");
        assert_eq!(data.get_u8(), 0, "a compressed message");
        let len = data.get_u32() as usize;
        assert!(data.len() >= len, "a cut message: {len} bytes announced");
        messages.push(data.split_to(len));
    }
    messages
}

/// The bytes of a binary (`-bin`) metadata value: base64, with or without padding, as the gRPC
/// spec has receivers accept.
pub fn binary_metadata(value: &str) -> Vec<u8> {
    use base64::engine::{
        general_purpose::GeneralPurposeConfig, DecodePaddingMode, GeneralPurpose,
    };
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    ENGINE
        .decode(value)
        .unwrap_or_else(|e| panic!("not base64 ({e}): {value:?}"))
}

/// One protobuf field: its number and value (only the wire types these messages use).
#[derive(Debug, PartialEq, Eq)]
pub enum Field<'a> {
    Varint(u32, u64),
    Bytes(u32, &'a [u8]),
}

/// The fields of a protobuf message, in order; panics on anything but varints and
/// length-delimited fields, or on a cut message.
pub fn fields(mut buf: &[u8]) -> Vec<Field<'_>> {
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = buf.split_first().expect("a cut varint");
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
        }
        panic!("a varint over 10 bytes");
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf);
        let number = u32::try_from(key >> 3).expect("a field number");
        match key & 7 {
            0 => out.push(Field::Varint(number, varint(&mut buf))),
            2 => {
                let len = usize::try_from(varint(&mut buf)).unwrap();
                assert!(buf.len() >= len, "a cut field {number}");
                let (value, rest) = buf.split_at(len);
                out.push(Field::Bytes(number, value));
                buf = rest;
            }
            wire => panic!("field {number}: wire type {wire}"),
        }
    }
    out
}

/// `google.rpc.Status` as read by hand.
#[derive(Debug, Default)]
pub struct RpcStatus {
    pub code: i32,
    pub message: String,
    /// Each `google.protobuf.Any`: type URL and value bytes.
    pub details: Vec<(String, Vec<u8>)>,
}

pub fn decode_status(buf: &[u8]) -> RpcStatus {
    let mut status = RpcStatus::default();
    for field in fields(buf) {
        match field {
            Field::Varint(1, code) => status.code = code as i32,
            Field::Bytes(2, message) => {
                status.message = String::from_utf8(message.to_vec()).unwrap()
            }
            Field::Bytes(3, any) => {
                let (mut type_url, mut value) = (String::new(), Vec::new());
                for field in fields(any) {
                    match field {
                        Field::Bytes(1, url) => type_url = String::from_utf8(url.to_vec()).unwrap(),
                        Field::Bytes(2, v) => value = v.to_vec(),
                        other => panic!("Any: unexpected {other:?}"),
                    }
                }
                status.details.push((type_url, value));
            }
            other => panic!("Status: unexpected {other:?}"),
        }
    }
    status
}

/// `google.rpc.RetryInfo`'s `retry_delay` (a `google.protobuf.Duration`), read by hand.
pub fn decode_retry_delay(retry_info: &[u8]) -> Duration {
    let mut delay = None;
    for field in fields(retry_info) {
        match field {
            Field::Bytes(1, duration) => {
                let (mut secs, mut nanos) = (0u64, 0u64);
                for field in fields(duration) {
                    match field {
                        Field::Varint(1, s) => secs = s,
                        Field::Varint(2, n) => nanos = n,
                        other => panic!("Duration: unexpected {other:?}"),
                    }
                }
                assert!(
                    secs < 1 << 63 && nanos < 1_000_000_000,
                    "a negative or invalid Duration: {secs} s {nanos} ns"
                );
                delay = Some(Duration::new(secs, nanos as u32));
            }
            other => panic!("RetryInfo: unexpected {other:?}"),
        }
    }
    delay.expect("RetryInfo without retry_delay")
}
