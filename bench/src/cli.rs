//! Command-line arguments.

use std::path::PathBuf;

pub const USAGE: &str = "\
usage: mirror-bench datapath [--quick] [--out FILE]

  datapath     ns/packet of the classifier per case, beside the empty tc program
               (BPF_PROG_TEST_RUN; needs root)
  --quick      repeat 100,000 and 3 runs instead of 1,000,000 and 7 (a smoke test)
  --out FILE   also write the markdown report to FILE";

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Datapath { quick: bool, out: Option<PathBuf> },
    Help,
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    match args.next().as_deref() {
        Some("datapath") => {}
        Some("-h" | "--help" | "help") => return Ok(Command::Help),
        Some(other) => return Err(format!("unknown benchmark '{other}'")),
        None => return Err("name a benchmark".into()),
    }
    let (mut quick, mut out) = (false, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(args.next().ok_or("--out needs a file")?.into()),
            "-h" | "--help" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    Ok(Command::Datapath { quick, out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn datapath_options() {
        assert_eq!(p(&["datapath"]), Ok(Command::Datapath { quick: false, out: None }));
        assert_eq!(
            p(&["datapath", "--out", "r.md", "--quick"]),
            Ok(Command::Datapath { quick: true, out: Some("r.md".into()) })
        );
        assert_eq!(p(&["--help"]), Ok(Command::Help));
    }

    #[test]
    fn errors() {
        assert!(p(&[]).is_err());
        assert!(p(&["xdp"]).is_err());
        assert!(p(&["datapath", "--out"]).is_err());
        assert!(p(&["datapath", "--fast"]).is_err());
    }
}
