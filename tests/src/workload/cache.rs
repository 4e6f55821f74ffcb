//! What the tests build once per machine and keep: Go programs built from their modules (the
//! Go module proxy serves their dependencies), npm packages, the control plane. The cache is
//! `$MIRROR_E2E_CACHE`, else /var/cache/mirror-e2e; what is built there is named after a hash
//! of its sources, so a change rebuilds it, and one builder at a time works in it (a lock per
//! kind of build, across processes).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Where built things are kept between runs.
pub fn cache_dir() -> PathBuf {
    let dir =
        std::env::var_os("MIRROR_E2E_CACHE").map_or_else(|| "/var/cache/mirror-e2e".into(), PathBuf::from);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Holds a lock of the cache (one builder at a time, across processes) until dropped.
pub struct CacheLock(#[allow(dead_code)] std::fs::File);

impl CacheLock {
    /// Takes the lock `<name>.lock` of `cache`, waiting for its holder.
    pub fn take(cache: &Path, name: &str) -> CacheLock {
        let path = cache.join(format!("{name}.lock"));
        let f = std::fs::File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        // SAFETY: flock on a file we hold open; released when it is closed.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0, "locking {}", path.display());
        CacheLock(f)
    }
}

/// FNV-1a over files' contents and names, in hex: a cache key that does not depend on the
/// toolchain.
pub fn hash_files(files: &[PathBuf]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        for b in data.iter().chain(f.file_name().unwrap().as_encoded_bytes()) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The Go program of the module in `src` (its `go.mod`, its `go.sum` if any, its `*.go`
/// files), built with the toolchain `go` into the cache once as `<name>-<hash>` (dependencies
/// from the Go module proxy, `GOFLAGS=-mod=mod`, statically: `CGO_ENABLED=0`); the binary.
pub fn build_go(go: &Path, name: &str, src: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap_or_else(|e| panic!("reading {}: {e}", src.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let file = p.file_name().unwrap_or_default().to_string_lossy();
            file == "go.mod" || file == "go.sum" || file.ends_with(".go")
        })
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f.ends_with("go.mod")), "no go.mod in {}", src.display());
    let cache = cache_dir();
    let binary = cache.join(format!("{name}-{}", hash_files(&files)));
    let _lock = CacheLock::take(&cache, name);
    if binary.is_file() {
        return binary;
    }
    let t = Instant::now();
    // Built from a copy: -mod=mod may touch go.mod and go.sum.
    let work = tempfile::Builder::new().prefix(name).tempdir().expect("a temp dir");
    for f in &files {
        std::fs::copy(f, work.path().join(f.file_name().unwrap())).expect("copying the Go sources");
    }
    let partial = cache.join(format!("{name}.partial"));
    let out = Command::new(go)
        .current_dir(work.path())
        .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
        .arg(&partial)
        .arg(".")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", go.display()));
    assert!(
        out.status.success(),
        "go build ({}) failed ({}): {}{}",
        src.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&partial, &binary).unwrap_or_else(|e| panic!("keeping {}: {e}", binary.display()));
    eprintln!("{name} built in {:.1} s: {}", t.elapsed().as_secs_f64(), binary.display());
    binary
}
