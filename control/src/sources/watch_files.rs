//! `--state PATH` watched for changes: the files are reread when any of them changes, and the
//! whole new state replaces the old one (the control loop diffs it, so editing one Service
//! retranslates one Service).
//!
//! Changes are found by polling a fingerprint (every file's path, size and modification time, and
//! the set of files) rather than with inotify: it sees a ConfigMap volume's atomic symlink swap, a
//! file replaced by rename, editors' write patterns and network filesystems alike, and it costs a
//! few `stat`s per poll. A state that cannot be read (a half-written file, a YAML error, an
//! invalid object) is reported naming the file, document and field, and the last good tables
//! stay; the next change is read again.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, SystemTime};

use crate::sources::files::{collect_files, load_state};
use crate::sync::Update;

/// The source name in metrics and status.
pub const SOURCE: &str = "files";

/// What the files looked like: (path, size, mtime) of each, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint(Vec<(PathBuf, u64, Option<SystemTime>)>);

/// The fingerprint of the state under `path` (an error text when it cannot be listed).
pub fn fingerprint(path: &Path) -> Result<Fingerprint, String> {
    let files = collect_files(path).map_err(|e| e.to_string())?;
    let mut v = Vec::with_capacity(files.len());
    for f in files {
        let (len, mtime) = match std::fs::metadata(&f) {
            Ok(m) => (m.len(), m.modified().ok()),
            Err(_) => (u64::MAX, None),
        };
        v.push((f, len, mtime));
    }
    Ok(Fingerprint(v))
}

/// Polls `path` every `poll` and sends a `ReplaceAll` after each change (and once at start), or
/// a `SourceError` when the state cannot be read.
pub fn spawn(rt: &tokio::runtime::Handle, path: PathBuf, poll: Duration, tx: Sender<Update>) {
    rt.spawn(async move {
        let mut last: Option<Result<Fingerprint, String>> = None;
        loop {
            let p = path.clone();
            let fp = tokio::task::spawn_blocking(move || fingerprint(&p))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            if last.as_ref() != Some(&fp) {
                let update = match &fp {
                    Err(e) => Update::SourceError {
                        source: SOURCE.into(),
                        message: e.clone(),
                    },
                    Ok(_) => {
                        let p = path.clone();
                        match tokio::task::spawn_blocking(move || load_state(&p)).await {
                            Ok(Ok(state)) => Update::ReplaceAll {
                                source: SOURCE.into(),
                                state,
                            },
                            Ok(Err(e)) => Update::SourceError {
                                source: SOURCE.into(),
                                message: format!("{e}; keeping the last good state"),
                            },
                            Err(e) => Update::SourceError {
                                source: SOURCE.into(),
                                message: e.to_string(),
                            },
                        }
                    }
                };
                if tx.send(update).is_err() {
                    return;
                }
                last = Some(fp);
            }
            tokio::time::sleep(poll).await;
        }
    });
}
