//! The systemd unit `make install` installs (config/mirror-agent.service), as make fills it
//! in, is one systemd accepts: `systemd-analyze verify` (its keys, its ExecStart, its
//! capabilities). With CI=true a missing systemd-analyze fails the test.

use std::path::Path;
use std::process::Command;

use mirror_bpf::testing::in_ci;

#[test]
fn the_installed_unit_verifies() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if analyze.is_err() {
        assert!(!in_ci(), "systemd-analyze is missing (package systemd)");
        eprintln!("skipped: no systemd-analyze");
        return;
    }
    let unit =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/mirror-agent.service"))
            .expect("config/mirror-agent.service");
    assert!(unit.contains("ExecStart=@PREFIX@/bin/mirror-agent "), "{unit}");
    // As `make install PREFIX=...` fills it in, with this build's binary.
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mirror-agent"), prefix.join("bin/mirror-agent")).unwrap();
    let path = dir.path().join("mirror-agent.service");
    std::fs::write(&path, unit.replace("@PREFIX@", &prefix.display().to_string())).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // Only what concerns this unit: verify also loads the units it names (network.target...).
    let ours: Vec<&str> = said.lines().filter(|l| l.contains("mirror-agent.service")).collect();
    assert!(out.status.success() && ours.is_empty(), "systemd-analyze verify:\n{said}");
}
