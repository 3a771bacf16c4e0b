//! The gateway demo as a user runs it: the example binary, its flags, its `listening on` line.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// `target/<profile>/examples/gateway`, built by `cargo test` before the tests run.
pub fn gateway_bin() -> PathBuf {
    super::example_bin("gateway")
}

pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub banner: Vec<String>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_gateway(args: &[&str]) -> Gateway {
    start_gateway_with_stderr(args, Stdio::null())
}

/// [`start_gateway`], with the gateway's stderr (its log) going to `stderr`.
pub fn start_gateway_with_stderr(args: &[&str], stderr: impl Into<Stdio>) -> Gateway {
    let child = Command::new(gateway_bin())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    // Owned by the guard at once, so the process is killed and reaped on every path.
    let mut gw = Gateway {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        banner: Vec::new(),
    };
    let stdout = gw.child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no `listening on` line; got {:?}", gw.banner));
        let addr = line
            .split("listening on http://")
            .nth(1)
            .map(|a| a.trim().parse::<SocketAddr>());
        gw.banner.push(line);
        if let Some(addr) = addr {
            gw.addr = addr.unwrap();
            return gw;
        }
    }
}

/// Runs the gateway with `args` (on a free port, should it start) and asserts that it refuses
/// them at start-up: it exits non-zero with `says` on stderr. A gateway that accepts them
/// (still running after 30 s) is killed and the assertion fails. Returns its stderr.
pub fn assert_refused(args: &[&str], says: &str) -> String {
    let mut child = Command::new(gateway_bin())
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} was accepted: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
    stderr.into_owned()
}

/// GET / over a fresh connection with `extra` header lines (raw bytes, each ending in
/// `\r\n`, so they may hold bytes that are not UTF-8); returns (status, lower-cased head).
pub fn get(addr: SocketAddr, extra: impl AsRef<[u8]>) -> (u16, String) {
    get_path(addr, "/", extra)
}

/// GET `path`, as [`get`].
pub fn get_path(addr: SocketAddr, path: &str, extra: impl AsRef<[u8]>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(70))).unwrap();
    let mut request =
        format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n").into_bytes();
    request.extend_from_slice(extra.as_ref());
    request.extend_from_slice(b"\r\n");
    s.write_all(&request).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out.to_ascii_lowercase())
}
