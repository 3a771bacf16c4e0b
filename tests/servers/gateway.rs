//! The gateway as a user runs it: its binary, its flags, its `listening on` line.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

/// The gateway's binary, which Cargo builds for the gateway package's tests
/// (`CARGO_BIN_EXE_gateway`); the library's own tests do not start it.
pub fn gateway_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_gateway") {
        Some(bin) => PathBuf::from(bin),
        None => panic!("the gateway runs in the gateway package's tests (gateway/tests/)"),
    }
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

/// Writes `text` to `path` whole: into a file beside it, renamed into place (a watcher never
/// reads half of it).
pub fn write_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
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

/// The gateway demo with its admin listener (`--admin-listen 127.0.0.1:0`), and what it wrote
/// on stderr so far.
pub struct AdminGateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
}

impl Drop for AdminGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AdminGateway {
    /// Starts the gateway with `args` and `--admin-listen 127.0.0.1:0`, and reads both of its
    /// `listening on` lines.
    pub fn start(args: &[&str]) -> AdminGateway {
        Self::start_command(Command::new(gateway_bin()), args)
    }

    /// [`start`](Self::start), the gateway allowed at most `limit` open descriptors (`ulimit
    /// -n`, through `sh`, which then runs the gateway in its place).
    pub fn start_with_descriptors(limit: u32, args: &[&str]) -> AdminGateway {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
            .arg(gateway_bin());
        Self::start_command(sh, args)
    }

    /// [`start`](Self::start) by `command` (the gateway and any arguments of its own, which
    /// come first).
    pub fn start_command(mut command: Command, args: &[&str]) -> AdminGateway {
        command.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        let (child, log, rx) = spawn_logged(command.args(args));
        let mut gw = AdminGateway {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
        };
        let mut seen = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no `listening on` lines; got {seen:?}, {}", gw.log()));
            if let Some(addr) = line.strip_prefix("listening on http://") {
                gw.addr = addr.trim().parse().unwrap();
                let next = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                let admin = next
                    .strip_prefix("admin listening on http://")
                    .unwrap_or_else(|| panic!("the line after `listening on`: {next:?}"));
                gw.admin = admin.trim().parse().unwrap();
                return gw;
            }
            seen.push(line);
        }
    }

    /// What the gateway wrote on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the gateway's stderr holds `n` lines containing `what`, for at most
    /// `within`, and returns the whole of it; fails with the log if it does not.
    pub fn wait_lines(&self, what: &str, n: usize, within: Duration) -> String {
        wait_lines(&self.log, what, n, within)
    }
}

/// Starts `command` (a gateway) with its stdout and stderr piped: the child, its stderr as
/// it comes (every line, kept), and its stdout line by line.
pub fn spawn_logged(command: &mut Command) -> (Child, Arc<Mutex<String>>, mpsc::Receiver<String>) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log: Arc<Mutex<String>> = Arc::default();
    let stderr = child.stderr.take().unwrap();
    let kept = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = kept.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, log, rx)
}

/// Waits until `log` holds `n` lines containing `what`, for at most `within`, and returns the
/// whole of it; fails with the log if it does not.
pub fn wait_lines(log: &Mutex<String>, what: &str, n: usize, within: Duration) -> String {
    let since = std::time::Instant::now();
    loop {
        let text = log.lock().unwrap().clone();
        if text.lines().filter(|l| l.contains(what)).count() >= n {
            return text;
        }
        assert!(
            since.elapsed() < within,
            "no {n} `{what}` lines within {within:?}: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Lower-cased.
    pub head: String,
    pub body: String,
}

impl Reply {
    /// The value of the header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n == name).then(|| v.trim())
        })
    }
}

/// One request over a fresh connection.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("content-length: 0\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}
