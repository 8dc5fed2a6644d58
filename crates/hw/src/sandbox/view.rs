//! A file system of its own for one confined program: an empty root with
//! only the files it needs bound in, so that nothing else of the host can
//! be opened, listed or even tested for existence.
//!
//! Landlock stops a program opening files outside its rules, but not
//! `stat`-ing them: a kernel's `__has_include("/any/path")` would still
//! tell which host paths exist, one bit per build. The device compile
//! therefore runs in a new mount namespace whose root is a fresh tmpfs
//! holding the compiler and its libraries, the kernel directory, the
//! device headers and the output directory (bind mounts, read-only but the
//! output), reached through the same paths as on the host, then `chroot`s
//! into it.
//!
//! What the view holds is decided in the parent ([`View::prepare`]): every
//! path is walked component by component so that the symbolic links on the
//! way (`/lib -> usr/lib`) exist in the view too. The child only makes
//! async-signal-safe system calls (`unshare`, `mount`, `mkdir`, `symlink`,
//! `open`, `close`, `chroot`, `chdir`). Where mount namespaces are refused
//! (no `CAP_SYS_ADMIN`), a warning is logged once and the other layers
//! stay; the view is then not applied.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use crate::error::HwError;

/// Whether this process may create mount namespaces (checked once, in a
/// throw-away child).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        super::may_unshare(
            (libc::CLONE_NEWNS, "CLONE_NEWNS"),
            "a mount namespace",
            "device compiles see the host's file system through Landlock only, which does not \
             hide whether a path exists",
        )
    })
}

/// What a program sees: these host paths, at the same paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    /// (host path, writable).
    pub paths: Vec<(PathBuf, bool)>,
}

#[derive(Debug)]
enum Node {
    Dir,
    Symlink(CString),
    /// Bind `source` here: (source, is a directory, writable).
    Bind(CString, bool, bool),
}

/// A view ready to apply in a child: its root and what to create in it.
#[derive(Debug)]
pub struct PreparedView {
    root: PathBuf,
    root_c: CString,
    /// Absolute path inside the view (joined to the root) and what it is.
    nodes: Vec<(CString, Node)>,
    cwd: CString,
}

impl Drop for PreparedView {
    fn drop(&mut self) {
        // The tmpfs lived in the child's namespace only: the host side is
        // the empty directory it was mounted on.
        let _ = std::fs::remove_dir(&self.root);
    }
}

fn c_path(p: &Path) -> Result<CString, HwError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| HwError::Config(format!("path with a NUL byte: {}", p.display())))
}

/// Add `path` and every component on the way to it to `nodes`, following
/// symbolic links so that their targets exist too.
fn add_path(
    nodes: &mut BTreeMap<PathBuf, Node>,
    path: &Path,
    writable: bool,
    depth: u32,
) -> Result<(), HwError> {
    if depth > 16 {
        return Err(HwError::Config(format!(
            "too many symbolic links resolving {}",
            path.display()
        )));
    }
    let mut at = PathBuf::from("/");
    let components: Vec<Component<'_>> = path.components().collect();
    for (i, component) in components.iter().enumerate() {
        let name = match component {
            Component::Normal(name) => name,
            Component::ParentDir => {
                // `at` has its links resolved: its parent is the real one.
                at.pop();
                continue;
            }
            _ => continue,
        };
        let next = at.join(name);
        let last = i + 1 == components.len();
        let meta = std::fs::symlink_metadata(&next)
            .map_err(|e| crate::error::io_err("reading", &next, e))?;
        if meta.file_type().is_symlink() {
            let target =
                std::fs::read_link(&next).map_err(|e| crate::error::io_err("reading", &next, e))?;
            nodes
                .entry(next.clone())
                .or_insert(Node::Symlink(c_path(&target)?));
            let resolved = if target.is_absolute() {
                target
            } else {
                at.join(target)
            };
            let rest: PathBuf = components[i + 1..].iter().collect();
            return add_path(nodes, &resolved.join(rest), writable, depth + 1);
        }
        if last {
            nodes.insert(
                next.clone(),
                Node::Bind(c_path(&next)?, meta.is_dir(), writable),
            );
        } else {
            nodes.entry(next.clone()).or_insert(Node::Dir);
        }
        at = next;
    }
    Ok(())
}

impl View {
    /// Resolve the view in the parent: a fresh empty directory to mount
    /// on, and the nodes to create in it, parents before children.
    pub fn prepare(&self, cwd: &Path) -> Result<PreparedView, HwError> {
        let mut nodes = BTreeMap::new();
        for (path, writable) in &self.paths {
            add_path(&mut nodes, path, *writable, 0)?;
        }
        // An empty directory of its own, removed when the step is done.
        let root = std::env::temp_dir().join(format!(".mtswarm-view-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&root).map_err(|e| crate::error::io_err("creating", &root, e))?;
        let mut prepared = Vec::new();
        for (path, node) in nodes {
            let inside = root.join(path.strip_prefix("/").unwrap_or(&path));
            prepared.push((c_path(&inside)?, node));
        }
        Ok(PreparedView {
            root_c: c_path(&root)?,
            root,
            nodes: prepared,
            cwd: c_path(cwd)?,
        })
    }
}

impl PreparedView {
    /// Enter the view (between fork and exec; async-signal-safe calls only).
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        let last = std::io::Error::last_os_error;
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: system calls on paths prepared in the parent, in a freshly
        // forked child that owns its new mount namespace.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(last());
            }
            let root = c"/";
            if libc::mount(
                none,
                root.as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(last());
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                self.root_c.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755".as_ptr().cast(),
            ) != 0
            {
                return Err(last());
            }
            for (path, node) in &self.nodes {
                match node {
                    Node::Dir => {
                        if libc::mkdir(path.as_ptr(), 0o755) != 0
                            && *libc::__errno_location() != libc::EEXIST
                        {
                            return Err(last());
                        }
                    }
                    Node::Symlink(target) => {
                        if libc::symlink(target.as_ptr(), path.as_ptr()) != 0
                            && *libc::__errno_location() != libc::EEXIST
                        {
                            return Err(last());
                        }
                    }
                    Node::Bind(source, is_dir, writable) => {
                        if *is_dir {
                            if libc::mkdir(path.as_ptr(), 0o755) != 0
                                && *libc::__errno_location() != libc::EEXIST
                            {
                                return Err(last());
                            }
                        } else {
                            let fd =
                                libc::open(path.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                            if fd < 0 {
                                return Err(last());
                            }
                            libc::close(fd);
                        }
                        if libc::mount(
                            source.as_ptr(),
                            path.as_ptr(),
                            none,
                            libc::MS_BIND | libc::MS_REC,
                            std::ptr::null(),
                        ) != 0
                        {
                            return Err(last());
                        }
                        if !writable
                            && libc::mount(
                                none,
                                path.as_ptr(),
                                none,
                                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                                std::ptr::null(),
                            ) != 0
                        {
                            return Err(last());
                        }
                    }
                }
            }
            if libc::chroot(self.root_c.as_ptr()) != 0 || libc::chdir(self.cwd.as_ptr()) != 0 {
                return Err(last());
            }
        }
        Ok(())
    }
}

/// Files the program `binary` loads: the binary itself, its dynamic loader
/// and libraries (from `ldd`, read once per binary).
pub fn program_files(binary: &Path) -> Result<Vec<PathBuf>, HwError> {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<PathBuf, Vec<PathBuf>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(files) = cache.lock().ok().and_then(|c| c.get(binary).cloned()) {
        return Ok(files);
    }
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| HwError::launch_caused(format!("ldd {}: {e}", binary.display()), e))?;
    let mut files = vec![binary.to_path_buf()];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    if let Ok(mut c) = cache.lock() {
        c.insert(binary.to_path_buf(), files.clone());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_links_on_the_way_are_recreated_and_targets_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::write(real.join("f"), "x").expect("write");
        std::os::unix::fs::symlink("real", dir.path().join("link")).expect("symlink");
        let mut nodes = BTreeMap::new();
        add_path(&mut nodes, &dir.path().join("link/f"), false, 0).expect("resolves");
        assert!(matches!(
            nodes.get(&dir.path().join("link")),
            Some(Node::Symlink(_))
        ));
        assert!(matches!(
            nodes.get(&dir.path().join("real")),
            Some(Node::Dir)
        ));
        assert!(matches!(
            nodes.get(&real.join("f")),
            Some(Node::Bind(_, false, false))
        ));
        // Parents sort before children, so creation order is right.
        let keys: Vec<_> = nodes.keys().collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
}
