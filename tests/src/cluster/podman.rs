//! The agent's image built and run with podman, as a node's container runtime runs it: the
//! image from `docker/Dockerfile`'s `runtime-prebuilt` target (the binaries these tests use,
//! stripped) on the local base image of `scripts/base-image.sh` (no registry needed), and
//! containers removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::agent::Binaries;

/// The local base image (made once per machine by scripts/base-image.sh).
pub const BASE_IMAGE: &str = "localhost/mirror-base:bookworm";

/// podman with the runtime and cgroup manager that work without systemd here.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    c
}

/// Runs a command; panics with its output unless it succeeds.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What building the image took.
#[derive(Debug)]
pub struct Built {
    /// The tag.
    pub tag: String,
    /// Seconds for the base image (0 when cached).
    pub base_s: f64,
    /// Seconds for the image.
    pub build_s: f64,
    /// Its size in bytes.
    pub size: u64,
}

/// Builds the image `tag` from the binaries the tests use: the base image first (cached), then
/// the `runtime-prebuilt` target with a context of only what it copies.
#[track_caller]
pub fn build_prebuilt(bins: &Binaries, tag: &str) -> Built {
    let root = repo_root();
    let t = Instant::now();
    run_ok(Command::new(root.join("scripts/base-image.sh")).arg(BASE_IMAGE));
    let base_s = t.elapsed().as_secs_f64();

    let ctx = tempfile::Builder::new().prefix("mirror-image").tempdir().expect("a temp dir");
    let prebuilt = ctx.path().join("docker/prebuilt");
    std::fs::create_dir_all(&prebuilt).expect("creating the context");
    std::fs::create_dir_all(ctx.path().join("config")).expect("creating the context");
    std::fs::copy(root.join("config/agent.yaml"), ctx.path().join("config/agent.yaml")).expect("copying");
    for (bin, name) in [(&bins.agent, "mirror-agent"), (&bins.ctl, "mirrorctl")] {
        run_ok(Command::new("strip").arg("-o").arg(prebuilt.join(name)).arg(bin));
    }
    let t = Instant::now();
    // The image the tag names now: replaced below, and removed once untagged (as `make image`
    // does), so that runs do not pile up untagged images.
    let inspect_id = |image: &str| {
        podman()
            .args(["image", "inspect", "--format", "{{.ID}}", image])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let old = inspect_id(tag);
    run_ok(
        podman()
            .args(["build", "-q", "-f"])
            .arg(root.join("docker/Dockerfile"))
            .args(["--target", "runtime-prebuilt", "--build-arg"])
            .arg(format!("RUNTIME_IMAGE={BASE_IMAGE}"))
            .args(["-t", tag])
            .arg(ctx.path()),
    );
    let build_s = t.elapsed().as_secs_f64();
    if let Some(old) = old.filter(|old| inspect_id(tag).as_ref() != Some(old)) {
        let tags = podman().args(["image", "inspect", "--format", "{{len .RepoTags}}", &old]).output();
        if tags.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0") {
            let _ = podman().args(["rmi", &old]).output();
        }
    }
    let out = run_ok(podman().args(["image", "inspect", "--format", "{{.Size}}", tag]));
    let size = String::from_utf8_lossy(&out.stdout).trim().parse().expect("an image size");
    Built { tag: tag.to_string(), base_s, build_s, size }
}

/// The `--ulimit` arguments a container gets here: the limits of this process (podman's
/// defaults are above what an unprivileged-resource host lets it set).
pub fn ulimits() -> Vec<String> {
    let get = |res| {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit fills the struct we pass.
        unsafe { libc::getrlimit(res, &mut l) };
        l
    };
    let nofile = get(libc::RLIMIT_NOFILE);
    // runc sets RLIMIT_NPROC after switching to the container's process: a bounded value.
    let nproc = get(libc::RLIMIT_NPROC).rlim_cur.min(4096);
    vec![
        format!("--ulimit=nofile={}:{}", nofile.rlim_cur, nofile.rlim_max),
        format!("--ulimit=nproc={nproc}:{nproc}"),
    ]
}

/// A container, removed (killed if need be) on drop.
pub struct Container {
    name: String,
}

impl Container {
    /// `podman run -d --name NAME ARGS...` (args from
    /// [`crate::cluster::kube::Manifests::podman_args`]).
    #[track_caller]
    pub fn start(name: &str, args: &[String]) -> Container {
        let _ = podman().args(["rm", "-f", name]).output();
        run_ok(podman().args(["run", "-d", "--name", name]).args(ulimits()).args(args));
        Container { name: name.to_string() }
    }

    /// `podman run --rm ARGS...` to completion (an init container); returns its output.
    #[track_caller]
    pub fn run_to_end(args: &[String]) -> String {
        let out = run_ok(podman().args(["run", "--rm"]).args(ulimits()).args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `podman exec NAME ARGS...`.
    pub fn exec(&self, args: &[&str]) -> Output {
        podman().args(["exec", &self.name]).args(args).output().expect("running podman exec")
    }

    /// Like [`Container::exec`]; panics unless it succeeds, returns stdout.
    #[track_caller]
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(out.status.success(), "podman exec {} {args:?}: {out:?}\n{}", self.name, self.logs());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Its log (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = podman().args(["logs", &self.name]).output().expect("running podman logs");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        let out = podman().args(["inspect", "--format", "{{.State.Running}}", &self.name]).output();
        out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
    }

    /// `podman stop` (SIGTERM, then SIGKILL after `grace`); returns the exit code and the log.
    #[track_caller]
    pub fn stop(&self, grace: Duration) -> (i32, String) {
        run_ok(podman().args(["stop", "-t", &grace.as_secs().to_string(), &self.name]));
        let out = run_ok(podman().args(["inspect", "--format", "{{.State.ExitCode}}", &self.name]));
        let code = String::from_utf8_lossy(&out.stdout).trim().parse().expect("an exit code");
        (code, self.logs())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "10", &self.name]).output();
    }
}

/// A directory made a shared mount point of its own, as a node's /sys/fs/bpf is, so that an
/// init container's bpffs mount (Bidirectional) reaches the host; unmounted on drop.
pub struct SharedMount(PathBuf);

impl SharedMount {
    /// Creates `path` and makes it a shared mount point.
    pub fn new(path: &Path) -> SharedMount {
        std::fs::create_dir_all(path).expect("creating the bpffs directory");
        let p = path.display();
        mirror_bpf::testing::sh(&format!("mount --bind {p} {p} && mount --make-shared {p}"));
        SharedMount(path.to_path_buf())
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        // A container just removed may hold it a moment longer (busy): retry a while.
        let unmounted = crate::proc::wait_until(Duration::from_secs(5), || {
            let _ = Command::new("umount").arg("-R").arg(&self.0).output();
            !Command::new("mountpoint").arg("-q").arg(&self.0).status().is_ok_and(|s| s.success())
        });
        if !unmounted {
            eprintln!("{} is still mounted", self.0.display());
        }
    }
}
