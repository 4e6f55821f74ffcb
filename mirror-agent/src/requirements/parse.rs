//! What the node's requirements are read from, as text: the kernel's release (`uname -r`),
//! the effective capabilities of `/proc/self/status`, and `/proc/self/mountinfo`.

use std::path::{Path, PathBuf};

/// The version of a kernel release, `6.18.44-fc-v669` -> (6, 18); none when it starts
/// otherwise.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The effective capability set (`CapEff:`, hexadecimal) of a `/proc/PID/status` text.
pub fn effective_caps(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// How mounts below a mount point propagate from and to other mount namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// A peer group (`shared:N`): mounts go both ways.
    Shared,
    /// A slave (`master:N`): mounts come from the master.
    Slave,
    /// Neither: nothing comes or goes.
    Private,
}

/// One line of `/proc/PID/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// Its file system type (`bpf` for a bpffs).
    pub fstype: String,
    /// Its propagation.
    pub propagation: Propagation,
}

/// The mounts of a `/proc/PID/mountinfo` text, in its order (a later one over an earlier one
/// at the same point hides it). Lines that do not parse are left out.
pub fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo.lines().filter_map(mount).collect()
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`: id,
/// parent, device, root, mount point, options, optional fields up to `-`, then the type.
fn mount(line: &str) -> Option<Mount> {
    let (head, tail) = line.split_once(" - ")?;
    let fields: Vec<&str> = head.split(' ').collect();
    let point = unescape(fields.get(4)?);
    let optional = fields.get(6..).unwrap_or_default();
    let propagation = if optional.iter().any(|f| f.starts_with("shared:")) {
        Propagation::Shared
    } else if optional.iter().any(|f| f.starts_with("master:")) {
        Propagation::Slave
    } else {
        Propagation::Private
    };
    let fstype = tail.split(' ').next()?.to_string();
    Some(Mount { point: PathBuf::from(point), fstype, propagation })
}

/// A mountinfo path field: space, tab, newline and backslash are octal escapes (`\040`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal =
            b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount that holds `path` (absolute, symlinks resolved): the one at the longest mount
/// point above it, the last listed where several share that point.
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.point))
        .max_by_key(|(i, m)| (m.point.components().count(), *i))
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases() {
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("5.14.0-362.8.1.el9_3.x86_64"), Some((5, 14)));
        assert_eq!(kernel_version("6.2"), Some((6, 2)));
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("linux"), None);
        assert_eq!(kernel_version("6"), None);
    }

    #[test]
    fn capabilities_of_a_status() {
        let status = "Name:\tmirror-agent\nCapInh:\t0000000000000000\nCapPrm:\t000001fffeffffff\n\
                      CapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n";
        assert_eq!(effective_caps(status), Some(0x1ff_feff_ffff));
        assert_eq!(effective_caps("CapEff:\t000000c000001000\n"), Some((1 << 39) | (1 << 38) | (1 << 12)));
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }

    /// A node's mounts: `/` shared, the host's bpffs shared below /sys, and in a pod a bpffs
    /// bind-mounted as a slave (HostToContainer) or privately (no propagation).
    const HOST: &str = "\
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
1 0 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
42 22 0:39 / /sys/fs/bpf rw,nosuid,nodev,noexec,relatime shared:13 - bpf bpf rw,mode=700
31 1 0:26 / /run rw,nosuid,nodev shared:12 - tmpfs tmpfs rw,mode=755
";

    #[test]
    fn the_mount_of_a_path() {
        let m = mounts(HOST);
        assert_eq!(m.len(), 4);
        let bpf = mount_of(&m, Path::new("/sys/fs/bpf/mirror-agent")).unwrap();
        assert_eq!((bpf.point.as_path(), bpf.fstype.as_str()), (Path::new("/sys/fs/bpf"), "bpf"));
        assert_eq!(bpf.propagation, Propagation::Shared);
        // A path beside it, not below it.
        assert_eq!(mount_of(&m, Path::new("/sys/fs/bpfx")).unwrap().fstype, "sysfs");
        assert_eq!(mount_of(&m, Path::new("/var/lib")).unwrap().point, Path::new("/"));
        // A later mount at the same point hides the earlier one.
        let over = format!("{HOST}99 42 0:50 / /sys/fs/bpf rw - tmpfs tmpfs rw\n");
        assert_eq!(mount_of(&mounts(&over), Path::new("/sys/fs/bpf/x")).unwrap().fstype, "tmpfs");
        // In containers: the bpffs as a slave of the host's, or private; several optional fields.
        let pod = "1200 1100 0:39 / /sys/fs/bpf rw,relatime master:13 - bpf bpf rw\n\
                   1201 1100 0:39 / /host/bpf rw,relatime shared:40 master:13 - bpf bpf rw\n\
                   1202 1100 0:39 / /private/bpf rw,relatime - bpf bpf rw\n";
        let m = mounts(pod);
        let prop = |p: &str| mount_of(&m, Path::new(p)).unwrap().propagation;
        assert_eq!(prop("/sys/fs/bpf/mirror-agent"), Propagation::Slave);
        assert_eq!(prop("/host/bpf/pins"), Propagation::Shared);
        assert_eq!(prop("/private/bpf/pins"), Propagation::Private);
        assert_eq!(mount_of(&m, Path::new("/etc")), None);
        // Escaped spaces; lines that do not parse are left out.
        let odd = "5 1 0:40 / /mnt/with\\040space rw shared:3 - bpf bpf rw\nnonsense\n";
        let m = mounts(odd);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].point, Path::new("/mnt/with space"));
    }
}
