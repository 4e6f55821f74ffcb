//! What the numbers were measured on, for the report header.

use std::process::Command;

/// The machine, kernel and time of a measurement.
#[derive(Debug, Clone)]
pub struct Host {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    /// UTC, ISO 8601.
    pub date: String,
}

impl Host {
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (cpu, cores) = parse_cpuinfo(&cpuinfo);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        Host { cpu, cores, kernel, date: utc_now() }
    }
}

/// The first CPU model name and the number of logical CPUs listed.
fn parse_cpuinfo(text: &str) -> (String, usize) {
    let field = |line: &str, name: &str| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_string())
    };
    let model = text.lines().find_map(|l| field(l, "model name")).unwrap_or_else(|| "unknown".into());
    let cores = text.lines().filter(|l| field(l, "processor").is_some()).count();
    (model, cores)
}

fn utc_now() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output();
    out.ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".into(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_model_and_count() {
        let text = "processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\nflags\t\t: fpu\n\n\
                    processor\t: 1\nmodel name\t: Example CPU @ 2.0GHz\n";
        assert_eq!(parse_cpuinfo(text), ("Example CPU @ 2.0GHz".into(), 2));
        assert_eq!(parse_cpuinfo(""), ("unknown".into(), 0));
    }
}
