//! The admin socket's client side (the `kxdp conntrack|services|stats|monitor` commands).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use kxdp_control::admin::wire::Request;

/// Sends `req` and hands every data line to `on_line` as it arrives (nothing is buffered beyond
/// one line). Returns the trailer's `end` value, or the server's error.
pub fn request(
    path: &Path,
    req: &Request,
    mut on_line: impl FnMut(&str) -> std::io::Result<()>,
) -> Result<serde_json::Value, String> {
    let mut sock = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot connect to the admin socket {}: {e} (is `kxdp run` running, and are you root?)",
            path.display()
        )
    })?;
    let mut body = serde_json::to_string(req).map_err(|e| e.to_string())?;
    body.push('\n');
    // A refused peer may find the socket closed before it writes: the error line is still there.
    let _ = sock.write_all(body.as_bytes());
    let mut reader = BufReader::with_capacity(64 * 1024, sock);
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| format!("admin socket: {e}"))?;
        if n == 0 {
            return Err("admin socket: connection closed before the answer ended".into());
        }
        let l = line.trim_end();
        if l.starts_with("{\"end\":") || l.starts_with("{\"error\":") {
            let v: serde_json::Value =
                serde_json::from_str(l).map_err(|e| format!("admin socket: bad trailer: {e}"))?;
            if let Some(e) = v.get("error") {
                return Err(e.as_str().unwrap_or("error").to_string());
            }
            return Ok(v.get("end").cloned().unwrap_or_default());
        }
        if let Err(e) = on_line(l) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(serde_json::Value::Null);
            }
            return Err(e.to_string());
        }
    }
}
