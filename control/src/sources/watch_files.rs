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
//!
//! Careless writes:
//! - Only a settled state is read: its fingerprint must be the same at two polls in a row, and
//!   again after reading it. A file caught mid-write (`: > state.yaml`, an editor's truncate and
//!   rewrite, a slow copy) is read once the writer is done; a file replaced by rename settles at
//!   once.
//! - A state that would remove most Services at once (more than half, of at least
//!   `DRASTIC_MIN_SERVICES`) is reported as a source error naming the counts, and held for
//!   `DRASTIC_HOLD_POLLS` polls (5 s by default) before it is applied; fixing the files within
//!   that time means it is never applied. It is applied after that (a deliberate mass deletion
//!   must work), with a warning.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime};

use crate::model::ClusterState;

use crate::sources::event::Update;
use crate::sources::files::{collect_files, load_state};

/// The source name in metrics and status.
pub const SOURCE: &str = "files";

/// A state that removes more than half of at least this many Services is held before applying.
pub const DRASTIC_MIN_SERVICES: usize = 4;

/// Polls a drastic state must stay unchanged before it is applied.
pub const DRASTIC_HOLD_POLLS: u32 = 10;

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

/// The state as read before the watch starts (`kxdp run` reads it at start to refuse bad input
/// with exit 2), with the fingerprint the files had before it was read: the watch sends it as
/// its first state instead of reading the files a second time (at 30,000 Services a read is
/// most of the startup), once the files are seen settled as for any read.
pub struct Preloaded {
    fingerprint: Result<Fingerprint, String>,
    taken: Instant,
    state: ClusterState,
}

impl Preloaded {
    /// Reads the state under `path` (the error names file, document and field).
    pub fn load(path: &Path) -> Result<Preloaded, crate::sources::files::StateError> {
        let taken = Instant::now();
        let fingerprint = fingerprint(path);
        let state = load_state(path)?;
        Ok(Preloaded {
            fingerprint,
            taken,
            state,
        })
    }

    /// The state read.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }
}

/// Polls `path` every `poll` and sends a `ReplaceAll` after each settled change (and once at
/// start: `preloaded` when the files have not changed since it was read), or a `SourceError`
/// when the state cannot be read or is held as drastic.
pub fn spawn(
    rt: &tokio::runtime::Handle,
    path: PathBuf,
    poll: Duration,
    preloaded: Option<Preloaded>,
    tx: Sender<Update>,
) {
    rt.spawn(async move {
        let mut watch = Watch::default();
        if let Some(pre) = preloaded {
            // Settled as any read must be: the same fingerprint before the read and again
            // at least one poll later, after it.
            tokio::time::sleep(poll.saturating_sub(pre.taken.elapsed())).await;
            let fp = pre.fingerprint;
            if fp.is_ok() && stat(&path).await == fp {
                watch.seen = Some(fp.clone());
                if let Some(update) = watch.step(fp, Some(Ok(pre.state)), &path) {
                    if tx.send(update).is_err() {
                        return;
                    }
                }
            }
        }
        loop {
            let fp = stat(&path).await;
            let state = if watch.wants_read(&fp) {
                let p = path.clone();
                let loaded = tokio::task::spawn_blocking(move || load_state(&p))
                    .await
                    .unwrap_or_else(|e| {
                        Err(crate::sources::files::StateError {
                            file: path.clone(),
                            document: None,
                            object: None,
                            field: String::new(),
                            message: e.to_string(),
                        })
                    });
                // Changed while being read: not settled after all.
                (stat(&path).await == fp).then_some(loaded)
            } else {
                None
            };
            if let Some(update) = watch.step(fp, state, &path) {
                if tx.send(update).is_err() {
                    return;
                }
            }
            tokio::time::sleep(poll).await;
        }
    });
}

async fn stat(path: &Path) -> Result<Fingerprint, String> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || fingerprint(&p))
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// The decisions of the watch loop, apart from its timing and I/O (so tests drive them).
#[derive(Default)]
struct Watch {
    /// What the previous poll saw.
    seen: Option<Result<Fingerprint, String>>,
    /// What was last applied or reported.
    done: Option<Result<Fingerprint, String>>,
    /// Services in the last applied state.
    services: Option<usize>,
    /// A drastic state being held: its fingerprint and how many polls it has stayed.
    held: Option<(Fingerprint, u32)>,
}

impl Watch {
    /// Whether this poll's fingerprint is a settled change worth reading.
    fn wants_read(&self, fp: &Result<Fingerprint, String>) -> bool {
        fp.is_ok() && self.done.as_ref() != Some(fp) && self.seen.as_ref() == Some(fp)
    }

    /// Takes one poll (and the state read, when `wants_read` said so and it stayed settled);
    /// returns what to send.
    fn step(
        &mut self,
        fp: Result<Fingerprint, String>,
        loaded: Option<Result<ClusterState, crate::sources::files::StateError>>,
        path: &Path,
    ) -> Option<Update> {
        let settled = self.seen.as_ref() == Some(&fp);
        self.seen = Some(fp.clone());
        if self.done.as_ref() == Some(&fp) || !settled {
            if self
                .held
                .as_ref()
                .is_some_and(|(h, _)| Ok(h) != fp.as_ref())
            {
                self.held = None;
            }
            return None;
        }
        let update = match (&fp, loaded) {
            (Err(e), _) => Update::SourceError {
                source: SOURCE.into(),
                message: e.clone(),
            },
            (Ok(_), None) => return None,
            (Ok(_), Some(Err(e))) => Update::SourceError {
                source: SOURCE.into(),
                message: format!("{e}; keeping the last good state"),
            },
            (Ok(f), Some(Ok(state))) => {
                let now = state.services.len();
                if let Some(before) = self.services.filter(|&b| drastic(b, now)) {
                    let polls = match &self.held {
                        Some((h, n)) if h == f => n + 1,
                        _ => 1,
                    };
                    if polls <= DRASTIC_HOLD_POLLS {
                        let first = polls == 1;
                        self.held = Some((f.clone(), polls));
                        if !first {
                            return None;
                        }
                        let message = format!(
                            "{}: the new state removes {} of {before} Services at once; \
                             holding it for {DRASTIC_HOLD_POLLS} polls before applying it \
                             (fix the files now if this is a mistake); the last good tables stay \
                             meanwhile",
                            path.display(),
                            before - now
                        );
                        tracing::error!(source = SOURCE, "{message}");
                        return Some(Update::SourceError {
                            source: SOURCE.into(),
                            message,
                        });
                    }
                    tracing::warn!(
                        source = SOURCE,
                        path = %path.display(),
                        "applying a state that removes {} of {before} Services",
                        before - now
                    );
                }
                self.held = None;
                self.services = Some(now);
                Update::ReplaceAll {
                    source: SOURCE.into(),
                    state,
                }
            }
        };
        self.done = Some(fp);
        Some(update)
    }
}

/// Whether going from `before` to `after` Services removes most of them.
fn drastic(before: usize, after: usize) -> bool {
    before >= DRASTIC_MIN_SERVICES && after < before.div_ceil(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One poll as `spawn` makes it, synchronously.
    fn poll(w: &mut Watch, path: &Path) -> Option<Update> {
        let fp = fingerprint(path);
        let loaded = w.wants_read(&fp).then(|| load_state(path));
        w.step(fp, loaded, path)
    }

    fn services(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: ns}}\n\
                     spec: {{clusterIP: 172.30.0.{}, ports: [{{port: 80}}]}}\n---\n",
                    i + 1
                )
            })
            .collect()
    }

    fn applied(u: Option<Update>) -> Option<usize> {
        match u {
            Some(Update::ReplaceAll { state, .. }) => Some(state.services.len()),
            _ => None,
        }
    }

    /// Rewrites `f` so that its fingerprint changes even within one mtime tick.
    fn write(f: &Path, text: &str, tick: &mut u64) {
        std::fs::write(f, text).unwrap();
        *tick += 1;
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + *tick);
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }

    #[test]
    fn a_file_caught_mid_write_is_not_published() {
        // Read as it was, `: > state.yaml` while the daemon ran would empty the tables at once.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.yaml");
        let mut tick = 0;
        write(&f, &services(3), &mut tick);
        let mut w = Watch::default();
        assert!(poll(&mut w, &f).is_none(), "read only once settled");
        assert_eq!(applied(poll(&mut w, &f)), Some(3));
        // Truncated, then (before the next poll could see it settled) written again.
        write(&f, "", &mut tick);
        assert!(poll(&mut w, &f).is_none());
        write(&f, &services(2), &mut tick);
        assert!(poll(&mut w, &f).is_none());
        assert_eq!(
            applied(poll(&mut w, &f)),
            Some(2),
            "the written state, never the empty one"
        );
        assert!(poll(&mut w, &f).is_none(), "nothing new");
    }

    #[test]
    fn a_preloaded_state_is_sent_without_reading_the_files_again() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.yaml");
        let mut tick = 0;
        write(&f, &services(3), &mut tick);
        let every = Duration::from_millis(20);
        // Unchanged since it was read: sent as read (an empty state stands for it, so that a
        // second read of the files, holding 3 Services, would show).
        let (tx, rx) = std::sync::mpsc::channel();
        let pre = Preloaded {
            fingerprint: fingerprint(&f),
            taken: Instant::now(),
            state: ClusterState::new(),
        };
        spawn(rt.handle(), f.clone(), every, Some(pre), tx);
        let first = rx.recv_timeout(Duration::from_secs(10)).ok();
        assert_eq!(applied(first), Some(0), "the preloaded state, first");
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "the files are not read again while unchanged"
        );
        // Changed after it was read: the preloaded state is stale and the files are read.
        let (tx, rx) = std::sync::mpsc::channel();
        let pre = Preloaded {
            fingerprint: fingerprint(&f),
            taken: Instant::now(),
            state: ClusterState::new(),
        };
        write(&f, &services(2), &mut tick);
        spawn(rt.handle(), f.clone(), every, Some(pre), tx);
        let first = rx.recv_timeout(Duration::from_secs(10)).ok();
        assert_eq!(applied(first), Some(2), "the files as they are now");
    }

    #[test]
    fn a_state_removing_most_services_is_held_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.yaml");
        let mut tick = 0;
        write(&f, &services(10), &mut tick);
        let mut w = Watch::default();
        poll(&mut w, &f);
        assert_eq!(applied(poll(&mut w, &f)), Some(10));
        // Emptied and left so: reported loudly, held, then applied.
        write(&f, "", &mut tick);
        assert!(poll(&mut w, &f).is_none());
        match poll(&mut w, &f) {
            Some(Update::SourceError { message, .. }) => {
                assert!(message.contains("removes 10 of 10 Services"), "{message}")
            }
            _ => panic!("a drastic state is reported"),
        }
        for _ in 1..DRASTIC_HOLD_POLLS {
            assert!(poll(&mut w, &f).is_none(), "held");
        }
        assert_eq!(applied(poll(&mut w, &f)), Some(0), "applied after the hold");
        // Back to 10, then thinned to 3 and fixed within the hold: never applied.
        write(&f, &services(10), &mut tick);
        poll(&mut w, &f);
        assert_eq!(
            applied(poll(&mut w, &f)),
            Some(10),
            "growing is not drastic"
        );
        write(&f, &services(3), &mut tick);
        poll(&mut w, &f);
        assert!(matches!(poll(&mut w, &f), Some(Update::SourceError { .. })));
        write(&f, &services(9), &mut tick);
        poll(&mut w, &f);
        assert_eq!(
            applied(poll(&mut w, &f)),
            Some(9),
            "removing one of ten is not drastic"
        );
    }
}
