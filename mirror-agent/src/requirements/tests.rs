use super::*;
use std::path::PathBuf;

/// The host's mounts: `/` and /sys shared, the bpffs at /sys/fs/bpf.
const HOST: &str = "\
1 0 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
42 22 0:39 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:13 - bpf bpf rw,mode=700
";
/// Root's capabilities, all of them.
const ROOT: u64 = 0x1ff_feff_ffff;
/// The DaemonSet's: BPF, PERFMON, NET_ADMIN, SYS_PTRACE.
const DAEMONSET: u64 = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_PTRACE);

/// A node that has everything, the agent run as root on the host.
fn node() -> Facts {
    Facts {
        release: "6.18.44-fc-v669".into(),
        btf: true,
        kfunc: None,
        jit: Some("1".into()),
        caps: Some(ROOT),
        mountinfo: HOST.into(),
        pin_path: PathBuf::from("/sys/fs/bpf/mirror-agent"),
        cri_sockets: vec![PathBuf::from("/host/run/containerd/containerd.sock")],
        in_container: Some(false),
        attach_mode: AttachModeCfg::Auto,
    }
}

/// The findings of `requirement`, as (level, message).
fn of(f: &Facts, requirement: &str) -> Vec<(Level, String)> {
    evaluate(f).into_iter().filter(|x| x.requirement == requirement).map(|x| (x.level, x.message)).collect()
}

/// The one finding of `requirement`.
#[track_caller]
fn one(f: &Facts, requirement: &str) -> (Level, String) {
    let all = of(f, requirement);
    assert_eq!(all.len(), 1, "{all:?}");
    all.into_iter().next().unwrap()
}

/// Every message of a finding that is not met, from the facts below: docs/deployment.md lists
/// each as it is printed.
fn unmet_samples() -> Vec<Finding> {
    let mut samples = Vec::new();
    let mut add = |f: Facts| samples.extend(evaluate(&f).into_iter().filter(|x| x.level >= Level::Warning));
    add(Facts { release: "5.15.0-91-generic".into(), kfunc: Some(false), ..node() });
    add(Facts { release: "5.14.0-362.8.1.el9_3.x86_64".into(), kfunc: Some(true), ..node() });
    add(Facts { btf: false, ..node() });
    add(Facts { jit: Some("0".into()), ..node() });
    add(Facts { caps: Some(1 << CAP_NET_ADMIN), ..node() });
    add(Facts { caps: Some((1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN)), ..node() });
    let no_bpffs = "1 0 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                    22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n";
    add(Facts { mountinfo: no_bpffs.into(), caps: Some(DAEMONSET), ..node() });
    add(Facts { pin_path: "/var/lib/mirror-pins".into(), ..node() });
    let private = "1200 1100 0:39 / /sys/fs/bpf rw,relatime - bpf bpf rw\n";
    add(Facts { mountinfo: private.into(), in_container: Some(true), caps: Some(DAEMONSET), ..node() });
    let run = "1200 1100 0:39 / /sys/fs/bpf rw,relatime master:13 - bpf bpf rw\n\
               1201 1100 0:26 / /host/run ro,nosuid,nodev - tmpfs tmpfs rw\n";
    add(Facts { mountinfo: run.into(), in_container: Some(true), caps: Some(DAEMONSET), ..node() });
    samples
}

#[test]
fn a_node_with_everything_meets_every_requirement() {
    let all = evaluate(&node());
    assert!(all.iter().all(|f| f.level == Level::Ok), "{all:#?}");
    let names: Vec<&str> = all.iter().map(|f| f.requirement).collect();
    assert_eq!(
        names,
        ["kernel", "TCX", "BTF", "BPF JIT", "capabilities", "BPF filesystem", "mount propagation"]
    );
    assert!(verdict(&all).is_ok());
    // The DaemonSet's capabilities, in its container with the node's bpffs as a slave.
    let pod = "1200 1100 0:39 / /sys/fs/bpf rw,relatime master:13 - bpf bpf rw\n";
    let f = Facts { caps: Some(DAEMONSET), mountinfo: pod.into(), in_container: Some(true), ..node() };
    assert!(evaluate(&f).iter().all(|f| f.level == Level::Ok), "{:#?}", evaluate(&f));
}

#[test]
fn kernels_older_than_the_classifier_needs() {
    let old = Facts { release: "5.15.0-91-generic".into(), kfunc: Some(false), ..node() };
    assert_eq!(
        one(&old, "kernel"),
        (
            Level::Missing,
            "Linux 5.15.0-91-generic is older than 6.2, the oldest the classifier loads on (it calls the kfunc \
             bpf_cast_to_kern_ctx): upgrade the node's kernel"
                .into()
        )
    );
    // No TCX either: in auto mode an expected fallback, not an error.
    assert_eq!(one(&old, "TCX").0, Level::Note);
    // A distribution's kernel with the kfunc backported: a warning, the load decides.
    let backport = Facts { release: "5.14.0-362.8.1.el9_3.x86_64".into(), kfunc: Some(true), ..node() };
    assert_eq!(one(&backport, "kernel").0, Level::Warning);
    // 6.2 to 6.5: the classifier loads, with tc filters.
    let f = Facts { release: "6.5.0-44-generic".into(), ..node() };
    assert_eq!(one(&f, "kernel").0, Level::Ok);
    let (level, said) = one(&f, "TCX");
    assert_eq!(level, Level::Note);
    assert!(said.contains("as expected on this kernel"), "{said}");
    // attach.mode: tcx is the configuration's check (it asks the kernel); tc needs no TCX.
    assert_eq!(one(&Facts { attach_mode: AttachModeCfg::Tcx, ..f.clone() }, "TCX").0, Level::Ok);
    assert_eq!(one(&Facts { attach_mode: AttachModeCfg::Tc, ..f }, "TCX").0, Level::Ok);
    let odd = Facts { release: "custom".into(), ..node() };
    assert_eq!(of(&odd, "kernel")[0].0, Level::Warning);
    assert!(of(&odd, "TCX").is_empty());
}

#[test]
fn btf_and_the_jit() {
    assert_eq!(one(&Facts { btf: false, ..node() }, "BTF").0, Level::Missing);
    assert_eq!(one(&Facts { jit: Some("0".into()), ..node() }, "BPF JIT").0, Level::Missing);
    assert_eq!(one(&Facts { jit: Some("2".into()), ..node() }, "BPF JIT").0, Level::Ok);
    // In a network namespace of its own the sysctl may not be there: not a reason to stop.
    assert_eq!(one(&Facts { jit: None, ..node() }, "BPF JIT").0, Level::Note);
}

#[test]
fn capabilities_root_or_the_daemonsets() {
    let (level, said) = one(&Facts { caps: Some(1 << CAP_NET_ADMIN), ..node() }, "capabilities");
    assert_eq!(level, Level::Missing);
    assert!(
        said.starts_with("missing capabilities CAP_BPF, CAP_PERFMON: run mirror-agent as root"),
        "{said}"
    );
    let (_, said) = one(&Facts { caps: Some(0), ..node() }, "capabilities");
    assert!(said.starts_with("missing capabilities CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN:"), "{said}");
    // CAP_SYS_ADMIN stands for CAP_BPF and CAP_PERFMON; without CAP_SYS_PTRACE, a warning.
    let admin = Facts { caps: Some((1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN)), ..node() };
    let levels: Vec<Level> = of(&admin, "capabilities").into_iter().map(|(l, _)| l).collect();
    assert_eq!(levels, [Level::Ok, Level::Warning]);
    assert_eq!(one(&Facts { caps: Some(DAEMONSET), ..node() }, "capabilities").0, Level::Ok);
    assert_eq!(one(&Facts { caps: None, ..node() }, "capabilities").0, Level::Note);
}

#[test]
fn a_bpffs_at_the_pin_path_and_its_propagation() {
    let no_bpffs = "1 0 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                    22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n";
    // Root mounts one of its own (bpffs::ensure warns then); without CAP_SYS_ADMIN, it cannot.
    let f = Facts { mountinfo: no_bpffs.into(), ..node() };
    assert_eq!(one(&f, "BPF filesystem").0, Level::Note);
    assert!(of(&f, "mount propagation").is_empty());
    let f = Facts { caps: Some(DAEMONSET), ..f };
    assert_eq!(one(&f, "BPF filesystem").0, Level::Missing);
    // Elsewhere than /sys/fs/bpf, nothing is mounted for it.
    let (level, said) = one(&Facts { pin_path: "/var/lib/mirror-pins".into(), ..node() }, "BPF filesystem");
    assert_eq!(level, Level::Missing);
    assert_eq!(said, "bpf.pin_path: /var/lib/mirror-pins is not on a BPF filesystem (mount -t bpf bpf DIR)");
    // A bpffs of its own below the host's, anywhere.
    let own = format!("{HOST}77 1 0:60 / /srv/pins rw - bpf bpf rw\n");
    let f = Facts { mountinfo: own, pin_path: "/srv/pins/agent".into(), ..node() };
    assert_eq!(one(&f, "BPF filesystem"), (Level::Ok, "/srv/pins/agent on the bpffs at /srv/pins".into()));
    // In a container: a private mount is a warning, shared or slave is what the DaemonSet asks.
    let private = "1200 1100 0:39 / /sys/fs/bpf rw,relatime - bpf bpf rw\n";
    let pod = Facts { mountinfo: private.into(), in_container: Some(true), ..node() };
    assert_eq!(one(&pod, "mount propagation").0, Level::Warning);
    let shared = "1200 1100 0:39 / /sys/fs/bpf rw,relatime shared:50 - bpf bpf rw\n";
    assert_eq!(one(&Facts { mountinfo: shared.into(), ..pod.clone() }, "mount propagation").0, Level::Ok);
    // On the host, the same private mount is no concern; unknown, not checked.
    assert_eq!(one(&Facts { in_container: Some(false), ..pod.clone() }, "mount propagation").0, Level::Ok);
    assert_eq!(one(&Facts { in_container: None, ..pod }, "mount propagation").0, Level::Note);
}

#[test]
fn the_runtime_socket_directory_and_its_propagation() {
    // The DaemonSet's mounts: the node's bpffs and /run as slaves (HostToContainer).
    let slave = "1200 1100 0:39 / /sys/fs/bpf rw,relatime master:13 - bpf bpf rw\n\
                 1201 1100 0:26 / /host/run ro,nosuid,nodev master:12 - tmpfs tmpfs rw\n";
    let pod = Facts { mountinfo: slave.into(), in_container: Some(true), caps: Some(DAEMONSET), ..node() };
    let all = of(&pod, "mount propagation");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|(l, _)| *l == Level::Ok), "{all:?}");
    assert!(all[1].1.contains("/host/run"), "{all:?}");
    // The same directory mounted without propagation: a warning naming the socket and the mount.
    let private = slave.replace(" master:12 ", " ");
    let f = Facts { mountinfo: private, ..pod.clone() };
    let (level, said) = of(&f, "mount propagation").pop().unwrap();
    assert_eq!(level, Level::Warning);
    assert!(
        said.starts_with(
            "the container runtime's socket /host/run/containerd/containerd.sock is on a private mount of the \
             agent's container (/host/run):"
        ),
        "{said}"
    );
    assert!(verdict(&evaluate(&f)).is_ok(), "a warning does not stop the start");
    // Two sockets on one mount: one finding. A socket on the container's own root: none.
    let two = vec!["/host/run/containerd/containerd.sock".into(), "/host/run/crio/crio.sock".into()];
    assert_eq!(of(&Facts { cri_sockets: two, ..pod.clone() }, "mount propagation").len(), 2);
    let rootfs = "1100 1000 0:80 / / rw - overlay overlay rw\n1200 1100 0:39 / /sys/fs/bpf rw master:13 - bpf bpf rw\n";
    let f = Facts {
        mountinfo: rootfs.into(),
        cri_sockets: vec!["/run/containerd/containerd.sock".into()],
        ..pod
    };
    assert_eq!(of(&f, "mount propagation").len(), 1);
    // On the node itself, not checked.
    assert_eq!(of(&Facts { mountinfo: slave.into(), ..node() }, "mount propagation").len(), 1);
}

#[test]
fn the_start_stops_naming_every_missing_requirement() {
    let f = Facts { btf: false, jit: Some("0".into()), ..node() };
    let e = verdict(&evaluate(&f)).unwrap_err().to_string();
    assert!(e.starts_with("node requirements not met: /sys/kernel/btf/vmlinux is missing: "), "{e}");
    assert!(e.contains("; net.core.bpf_jit_enable is 0: "), "{e}");
    // Warnings and notes do not stop it.
    let f =
        Facts { release: "6.5.0".into(), caps: Some((1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN)), ..node() };
    assert!(verdict(&evaluate(&f)).is_ok());
    let text = report(&evaluate(&Facts { btf: false, ..node() }));
    assert!(text.contains("\n  MISSING  BTF: /sys/kernel/btf/vmlinux is missing"), "{text}");
    assert!(text.ends_with("the agent would not start on this node: a requirement is missing\n"), "{text}");
}

#[test]
fn deployment_md_lists_every_message() {
    let docs = include_str!("../../../docs/deployment.md");
    // Markdown code spans: the messages as the table shows them, one line each.
    let docs = docs.replace("\\|", "|");
    for f in unmet_samples() {
        assert!(docs.contains(&format!("`{}`", f.message)), "docs/deployment.md lacks:\n{}", f.message);
    }
}
