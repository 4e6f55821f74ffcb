//! `mirrorctl captures`: the captures the recorder keeps on this node, one per trigger
//! (`GET /v1/captures`); `captures get ID -w FILE` (or `-w -`, into `tshark -r -`) fetches
//! one, `captures rm ID` deletes one.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use hyper::Method;

use super::table;
use crate::api::client::Client;
use crate::views::CaptureView;

/// `captures` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CapturesCommand {
    /// Write capture ID's pcapng to a file, or to stdout (`-w -`).
    Get {
        /// The capture's id (`mirrorctl captures`, or an event's `capture.id`).
        id: u64,
        /// The file to write; `-` for stdout.
        #[arg(short = 'w', long = "write")]
        write: PathBuf,
    },
    /// Delete capture ID from the node.
    Rm {
        /// The capture's id.
        id: u64,
    },
}

/// The table's columns.
pub const HEADER: [&str; 10] =
    ["ID", "TIME", "POD", "RULE", "TRIGGER", "REQUEST", "FLOW", "PACKETS", "BYTES", "STATE"];

fn row(c: &CaptureView) -> Vec<String> {
    let state = match (&c.state[..], &c.key, c.uploaded) {
        (s, Some(_), true) => format!("{s}, uploaded"),
        ("open", _, _) => "open".to_string(),
        (s, Some(_), false) if c.upload_failures > 0 => {
            format!(
                "{s}, upload pending ({} failed: {})",
                c.upload_failures,
                c.upload_error.as_deref().unwrap_or("?")
            )
        }
        (s, Some(_), false) => format!("{s}, upload pending"),
        (s, None, _) => s.to_string(),
    };
    vec![
        c.id.to_string(),
        c.time.clone(),
        c.pod.clone(),
        c.rule_id.to_string(),
        c.trigger.clone(),
        c.request.clone().unwrap_or_else(|| "-".into()),
        c.flow.clone(),
        c.packets.to_string(),
        c.bytes.to_string(),
        state,
    ]
}

/// Runs `captures` (the listing) or one of its subcommands.
pub async fn run(c: &Client<'_>, json: bool, command: Option<CapturesCommand>) -> anyhow::Result<()> {
    match command {
        None => {
            let list: Vec<CaptureView> = c.call(Method::GET, "/v1/captures", None).await?;
            if json {
                return super::print_json(&list);
            }
            print!("{}", table::render(&HEADER, &list.iter().map(row).collect::<Vec<_>>()));
            Ok(())
        }
        Some(CapturesCommand::Get { id, write }) => {
            let to_stdout = write.as_os_str() == "-";
            let mut out: Box<dyn Write> = if to_stdout {
                Box::new(std::io::stdout().lock())
            } else {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .mode_private()
                    .open(&write)
                    .with_context(|| format!("creating {}", write.display()))?;
                Box::new(std::io::BufWriter::new(f))
            };
            let n = c.download(&format!("/v1/captures/{id}"), &mut out).await?;
            out.flush()?;
            if !to_stdout {
                eprintln!("mirrorctl: capture {id}: {n} bytes written to {}", write.display());
            }
            Ok(())
        }
        Some(CapturesCommand::Rm { id }) => {
            let _: serde_json::Value = c.call(Method::DELETE, &format!("/v1/captures/{id}"), None).await?;
            eprintln!("mirrorctl: capture {id} deleted");
            Ok(())
        }
    }
}

/// Files a capture is written to are the caller's alone (mode 0600): they hold payloads.
trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for std::fs::OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}
