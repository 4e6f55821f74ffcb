//! Command-line arguments.

use std::path::PathBuf;

pub const USAGE: &str = "\
usage: mirror-bench datapath [--quick] [--out FILE]
       mirror-bench traffic [--quick] [--out FILE] [--cpus CLIENT,SERVER] [--no-wait]
                            [--only STAGE,...] [--ladder http|h2|h2-data]
       mirror-bench mirror-path [--quick] [--out FILE] [--only test-run|traffic] [--rounds N]
       mirror-bench churn [--quick] [--out FILE] [--veths N] [--rounds N]
       mirror-bench drops [--quick] [--out FILE]

  datapath     ns/packet of the classifier per case, beside the empty tc program
               (BPF_PROG_TEST_RUN; needs root)
  traffic      iperf3, sockperf and HTTP (nginx, wrk) between network namespaces with no
               agent, qdiscs only, the agent passing or mirroring, a static tc mirror,
               tcpdump, and the mirred method; attach time and agent footprint for 1, 100
               and 1,000 veths (needs root)
  mirror-path  ns per copied packet by sink kind and way of copying (clone to a sink's
               egress or ingress, act_mirred): BPF_PROG_TEST_RUN and real HTTP traffic,
               perf's breakdown, what a capture on the sink sees (needs root)
  churn        attach latency in a burst of new veths (default 50) under a running agent:
               TCX with expedited or normal RCU grace periods, and tc; where the time of
               one attach goes, by phase (needs root)
  drops        the kernel's drops under the agent: lateness of the copy of a dropped
               packet on the sink (tcpdump on the veth and the sink), and a flood of dropped
               SYNs: the agent's CPU and the drop program's ns per run (needs root)
  --quick      short runs, fewer repetitions (a smoke test)
  --out FILE   also write the markdown report to FILE
  --cpus C,S   traffic: pin clients to CPU C and servers to CPU S (default: both on the
               last CPU)
  --no-wait    traffic: start at once instead of waiting for a quiet machine (full mode)
  --only S,..  traffic: run only these stages: loads (the alternating runs), bars (only the
               loads behind the bars, 9 rounds), attach, profile;
               mirror-path: test-run or traffic
  --ladder L   traffic: the load of the cost ladder (profile stage): http (wrk, the default),
               h2 (h2load, small answers) or h2-data (h2load, 256 KiB answers)
  --rounds N   mirror-path: rounds of traffic runs (default 7); churn: bursts per way of
               attaching (default 3, quick 1)
  --veths N    churn: veths per burst (default 50)";

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Datapath { quick: bool, out: Option<PathBuf> },
    Traffic(TrafficArgs),
    MirrorPath { quick: bool, out: Option<PathBuf>, test_run: bool, traffic: bool, rounds: Option<usize> },
    Churn { quick: bool, out: Option<PathBuf>, veths: usize, rounds: Option<usize> },
    Drops { quick: bool, out: Option<PathBuf> },
    Help,
}

/// Arguments of `traffic`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrafficArgs {
    pub quick: bool,
    pub out: Option<PathBuf>,
    /// (client CPU, server CPU).
    pub cpus: Option<(usize, usize)>,
    pub no_wait: bool,
    /// Stages to run (all when empty).
    pub only: Vec<Stage>,
    /// The load of the cost ladder (the default: HTTP/1.1 with wrk).
    pub ladder: Option<LadderLoad>,
}

/// What the cost ladder runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LadderLoad {
    /// wrk, HTTP/1.1, nothing triggered.
    Http,
    /// h2load, HTTP/2, small answers, nothing triggered.
    H2,
    /// h2load, HTTP/2, 256 KiB answers: mostly DATA.
    H2Data,
}

/// A stage of the traffic benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Loads,
    /// Only the loads behind the bars (HTTP passing and mirroring, sockperf passing, against no
    /// agent), in more rounds: the throughput and latency bars resolved at less cost.
    Bars,
    Attach,
    Profile,
}

fn parse_stages(s: &str) -> Result<Vec<Stage>, String> {
    s.split(',')
        .map(|w| match w.trim() {
            "loads" => Ok(Stage::Loads),
            "bars" => Ok(Stage::Bars),
            "attach" => Ok(Stage::Attach),
            "profile" => Ok(Stage::Profile),
            other => Err(format!("unknown stage '{other}' (loads, bars, attach, profile)")),
        })
        .collect()
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let traffic = match args.next().as_deref() {
        Some("mirror-path") => return parse_mirror_path(args),
        Some("churn") => return parse_churn(args),
        Some("drops") => return parse_drops(args),
        Some("datapath") => false,
        Some("traffic") => true,
        Some("-h" | "--help" | "help") => return Ok(Command::Help),
        Some(other) => return Err(format!("unknown benchmark '{other}'")),
        None => return Err("name a benchmark".into()),
    };
    let mut t = TrafficArgs::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => t.quick = true,
            "--out" => t.out = Some(args.next().ok_or("--out needs a file")?.into()),
            "--cpus" if traffic => t.cpus = Some(parse_cpus(&args.next().ok_or("--cpus needs C,S")?)?),
            "--no-wait" if traffic => t.no_wait = true,
            "--only" if traffic => t.only = parse_stages(&args.next().ok_or("--only needs stages")?)?,
            "--ladder" if traffic => {
                t.ladder = Some(match args.next().as_deref() {
                    Some("http") => LadderLoad::Http,
                    Some("h2") => LadderLoad::H2,
                    Some("h2-data") => LadderLoad::H2Data,
                    other => return Err(format!("--ladder takes http, h2 or h2-data, not {other:?}")),
                })
            }
            "-h" | "--help" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    Ok(if traffic { Command::Traffic(t) } else { Command::Datapath { quick: t.quick, out: t.out } })
}

fn parse_mirror_path(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let (mut quick, mut out, mut test_run, mut traffic, mut rounds) = (false, None, true, true, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(args.next().ok_or("--out needs a file")?.into()),
            "--only" => match args.next().as_deref() {
                Some("test-run") => traffic = false,
                Some("traffic") => test_run = false,
                other => return Err(format!("--only takes test-run or traffic, not {other:?}")),
            },
            "--rounds" => {
                let n = args.next().ok_or("--rounds needs a number")?;
                rounds = Some(n.parse().ok().filter(|n| *n > 0).ok_or(format!("--rounds: '{n}'"))?);
            }
            "-h" | "--help" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    Ok(Command::MirrorPath { quick, out, test_run, traffic, rounds })
}

fn parse_churn(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let (mut quick, mut out, mut veths, mut rounds) = (false, None, 50, None);
    let count = |flag: &str, v: Option<String>| -> Result<usize, String> {
        let n = v.ok_or(format!("{flag} needs a number"))?;
        n.parse().ok().filter(|n| *n > 0).ok_or(format!("{flag}: '{n}' is not a positive number"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(args.next().ok_or("--out needs a file")?.into()),
            "--veths" => veths = count("--veths", args.next())?,
            "--rounds" => rounds = Some(count("--rounds", args.next())?),
            "-h" | "--help" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    Ok(Command::Churn { quick, out, veths, rounds })
}

fn parse_drops(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let (mut quick, mut out) = (false, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(args.next().ok_or("--out needs a file")?.into()),
            "-h" | "--help" => return Ok(Command::Help),
            _ => return Err(format!("unknown argument '{arg}'")),
        }
    }
    Ok(Command::Drops { quick, out })
}

fn parse_cpus(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--cpus takes two CPU numbers, CLIENT,SERVER: '{s}'");
    let (c, s) = s.split_once(',').ok_or_else(bad)?;
    Ok((c.trim().parse().map_err(|_| bad())?, s.trim().parse().map_err(|_| bad())?))
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
    fn traffic_options() {
        assert_eq!(p(&["traffic"]), Ok(Command::Traffic(TrafficArgs::default())));
        assert_eq!(
            p(&[
                "traffic",
                "--quick",
                "--cpus",
                "0,1",
                "--no-wait",
                "--out",
                "bench/RESULTS.md",
                "--only",
                "loads,profile",
                "--ladder",
                "h2-data"
            ]),
            Ok(Command::Traffic(TrafficArgs {
                quick: true,
                out: Some("bench/RESULTS.md".into()),
                cpus: Some((0, 1)),
                no_wait: true,
                only: vec![Stage::Loads, Stage::Profile],
                ladder: Some(LadderLoad::H2Data),
            }))
        );
        assert!(p(&["traffic", "--ladder", "h3"]).is_err());
    }

    #[test]
    fn mirror_path_options() {
        assert_eq!(
            p(&["mirror-path"]),
            Ok(Command::MirrorPath { quick: false, out: None, test_run: true, traffic: true, rounds: None })
        );
        assert_eq!(
            p(&["mirror-path", "--quick", "--only", "traffic", "--out", "m.md", "--rounds", "20"]),
            Ok(Command::MirrorPath {
                quick: true,
                out: Some("m.md".into()),
                test_run: false,
                traffic: true,
                rounds: Some(20)
            })
        );
        assert!(p(&["mirror-path", "--only", "loads"]).is_err());
        assert!(p(&["mirror-path", "--cpus", "0,1"]).is_err());
        assert!(p(&["mirror-path", "--rounds", "0"]).is_err());
    }

    #[test]
    fn errors() {
        assert!(p(&[]).is_err());
        assert!(p(&["xdp"]).is_err());
        assert!(p(&["datapath", "--out"]).is_err());
        assert!(p(&["datapath", "--fast"]).is_err());
        assert!(p(&["datapath", "--cpus", "0,1"]).is_err());
        assert!(p(&["traffic", "--cpus", "0"]).is_err());
        assert!(p(&["traffic", "--cpus", "a,1"]).is_err());
        assert!(p(&["traffic", "--only", "loads,xdp"]).is_err());
        assert!(p(&["datapath", "--only", "loads"]).is_err());
    }
}
