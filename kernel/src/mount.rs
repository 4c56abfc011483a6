//! The conntrack state file's filesystem: whether a directory is a tmpfs that gives its files
//! huge pages, and mounting one that does.
//!
//! A file on tmpfs gets 2 MiB pages only when its mount says so (`huge=within_size`, `always`,
//! or `advise` with `MADV_HUGEPAGE`); `/run` and `/dev/shm` are mounted without it on every
//! common distribution, and `/sys/kernel/mm/transparent_hugepage/shmem_enabled` (default `never`)
//! does not apply to tmpfs mounts. A table of a million connections in 4 KiB pages costs a page
//! walk on most lookups (docs/benchmarks.md, "The state file in huge pages").
//!
//! `/proc/self/mountinfo` is read by hand: its format is a few space-separated fields with
//! octal escapes, and the crates that parse it (procfs) bring the whole of procfs for it.

use std::io;
use std::path::{Path, PathBuf};

/// The mount whose mount point is a directory, as `/proc/self/mountinfo` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPoint {
    pub fs_type: String,
    /// The superblock's options (`size=...,mode=...,huge=within_size`).
    pub super_options: String,
    /// Propagation `shared` (mountinfo's `shared:N`): mounts and unmounts here reach its peers
    /// (the host's namespace, for a container volume with `mountPropagation: Bidirectional`).
    pub shared: bool,
}

impl MountPoint {
    /// Whether files on this mount get huge pages: a tmpfs with `huge=` other than `never` and
    /// `deny` (`advise` counts: kxdp advises its mappings).
    pub fn gives_huge_pages(&self) -> bool {
        self.fs_type == "tmpfs"
            && self.super_options.split(',').any(|o| {
                matches!(
                    o.strip_prefix("huge="),
                    Some("always" | "within_size" | "advise")
                )
            })
    }
}

/// The mount mounted exactly at `dir` (the last one, as the kernel shows the top of a stack), or
/// None when `dir` is not a mount point. `dir` is compared as given after canonicalising it.
pub fn mount_at(dir: &Path) -> io::Result<Option<MountPoint>> {
    let dir = dir.canonicalize()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mount_at(&text, &dir))
}

/// The mount that holds `path` (an existing file or directory): the one at its deepest
/// ancestor that is a mount point.
pub fn mount_of(path: &Path) -> io::Result<MountPoint> {
    let path = path.canonicalize()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    parse_mount_of(&text, &path)
        .ok_or_else(|| io::Error::other("no mount holds it in /proc/self/mountinfo"))
}

fn parse_mount_of(mountinfo: &str, path: &Path) -> Option<MountPoint> {
    path.ancestors()
        .find_map(|dir| parse_mount_at(mountinfo, dir))
}

fn parse_mount_at(mountinfo: &str, dir: &Path) -> Option<MountPoint> {
    let mut found = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional fields...] - type source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut fields = left.split(' ');
        match fields.nth(4) {
            Some(mount_point) if PathBuf::from(unescape(mount_point)) == dir => {}
            _ => continue,
        }
        // After the mount options: the optional fields (`shared:N`, `master:N`, ...).
        let shared = fields.skip(1).any(|f| f.starts_with("shared:"));
        let mut r = right.split(' ');
        let fs_type = r.next().unwrap_or("").to_string();
        let super_options = r.nth(1).unwrap_or("").to_string();
        found = Some(MountPoint {
            fs_type,
            super_options,
            shared,
        });
    }
    found
}

/// mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + (c - b'0') as u32);
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether this process shares its mount namespace with PID 1; None when it cannot tell (PID
/// 1's namespace unreadable). A mount made in PID 1's namespace outlives the process even when
/// its propagation is private (a host whose root is not shared); `ip netns exec` and container
/// runtimes give a process a namespace of its own.
pub fn in_init_mount_namespace() -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let ns = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    Some(ns("/proc/self/ns/mnt")? == ns("/proc/1/ns/mnt")?)
}

/// `path` as the C string a system call takes.
fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// Mounts a tmpfs that gives its files huge pages (`huge=within_size`) at `dir`, root only
/// (mode 0700), with no devices, set-uid or executables. Needs `CAP_SYS_ADMIN`.
pub fn mount_huge_tmpfs(dir: &Path) -> io::Result<()> {
    let target = c_path(dir)?;
    let fstype = c"tmpfs";
    let data = c"huge=within_size,mode=0700";
    // SAFETY: every pointer is a NUL-terminated string that lives across the call; mount(2)
    // reads them and keeps none.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches the mount at `dir` (tests, and a failed set-up).
pub fn unmount(dir: &Path) -> io::Result<()> {
    let target = c_path(dir)?;
    // SAFETY: a NUL-terminated path that lives across the call.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=4096k,mode=755
40 22 0:35 / /run/kxdp/ct rw,nosuid,nodev,noexec shared:20 - tmpfs tmpfs rw,mode=700,huge=within_size
41 22 0:36 / /run/with\\040space rw - tmpfs tmpfs rw,huge=never
";

    #[test]
    fn finds_the_mount_at_a_directory() {
        let m = parse_mount_at(INFO, Path::new("/run/kxdp/ct")).unwrap();
        assert_eq!(m.fs_type, "tmpfs");
        assert!(m.gives_huge_pages());
        assert!(m.shared);
        let run = parse_mount_at(INFO, Path::new("/run")).unwrap();
        assert!(!run.gives_huge_pages());
        assert_eq!(parse_mount_at(INFO, Path::new("/run/kxdp")), None);
        let spaced = parse_mount_at(INFO, Path::new("/run/with space")).unwrap();
        assert!(!spaced.gives_huge_pages(), "huge=never gives none");
        assert!(!spaced.shared);
    }

    #[test]
    fn the_mount_holding_a_path_is_its_deepest_mounted_ancestor() {
        let info = format!("1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n{INFO}");
        let m = |p: &str| parse_mount_of(&info, Path::new(p)).unwrap();
        assert!(m("/run/kxdp/ct/conntrack").gives_huge_pages());
        assert_eq!(m("/run/kxdp/other").fs_type, "tmpfs");
        assert!(!m("/run/kxdp/other").gives_huge_pages());
        assert_eq!(m("/var/lib/kxdp").fs_type, "ext4");
        assert_eq!(parse_mount_of(INFO, Path::new("/var/lib")), None);
    }

    #[test]
    fn a_line_it_cannot_read_is_skipped() {
        let info = format!("garbage\n{INFO}");
        assert!(parse_mount_at(&info, Path::new("/run/kxdp/ct")).is_some());
    }

    #[test]
    fn the_last_mount_of_a_stack_counts() {
        let info = format!("{INFO}42 40 0:37 / /run/kxdp/ct rw - tmpfs tmpfs rw,mode=700\n");
        let m = parse_mount_at(&info, Path::new("/run/kxdp/ct")).unwrap();
        assert!(!m.gives_huge_pages());
    }

    #[test]
    fn only_tmpfs_with_huge_gives_huge_pages() {
        for (fs, opts, huge) in [
            ("tmpfs", "rw,huge=always", true),
            ("tmpfs", "rw,huge=advise", true),
            ("tmpfs", "rw,huge=deny", false),
            ("tmpfs", "rw", false),
            ("ext4", "rw,huge=always", false),
        ] {
            let m = MountPoint {
                fs_type: fs.into(),
                super_options: opts.into(),
                shared: true,
            };
            assert_eq!(m.gives_huge_pages(), huge, "{fs} {opts}");
        }
    }
}
