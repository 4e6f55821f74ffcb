//! Captures of the mirror: frames read from the mirror interface ([`socket`]), their addresses
//! and checksums ([`packet`]), written as pcapng with one interface per pod veth, a direction
//! and a comment per packet ([`PcapNgOut`]).

pub mod packet;
pub mod socket;

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

/// Which way a packet went, relative to the pod of its interface (pcapng `epb_flags` bits 0-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Not known.
    Unknown = 0,
    /// To the pod.
    Inbound = 1,
    /// From the pod.
    Outbound = 2,
}

/// A pcapng stream: interfaces described as they first carry a packet.
pub struct PcapNgOut<W: Write> {
    w: PcapNgWriter<W>,
    ids: HashMap<String, u32>,
    snaplen: u32,
}

impl<W: Write> PcapNgOut<W> {
    /// Starts the stream (section header); interfaces declare `snaplen`.
    pub fn new(out: W, snaplen: u32) -> anyhow::Result<Self> {
        Ok(PcapNgOut { w: PcapNgWriter::new(out)?, ids: HashMap::new(), snaplen })
    }

    /// Starts the stream with a section header carrying `comment` (what the capture is).
    pub fn with_comment(out: W, snaplen: u32, comment: &str) -> anyhow::Result<Self> {
        use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
        let shb = SectionHeaderBlock {
            endianness: pcap_file::Endianness::native(),
            options: vec![
                SectionHeaderOption::Comment(Cow::Owned(comment.to_string())),
                SectionHeaderOption::UserApplication(Cow::Borrowed(concat!(
                    "mirror-agent ",
                    env!("CARGO_PKG_VERSION")
                ))),
            ],
            ..SectionHeaderBlock::default()
        };
        Ok(PcapNgOut { w: PcapNgWriter::with_section_header(out, shb)?, ids: HashMap::new(), snaplen })
    }

    /// The id of the interface named `name`, described the first time (`description` says
    /// more: the veth, the pod's addresses).
    pub fn interface(&mut self, name: &str, description: &str) -> anyhow::Result<u32> {
        if let Some(id) = self.ids.get(name) {
            return Ok(*id);
        }
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: self.snaplen,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Owned(name.to_string())),
                InterfaceDescriptionOption::IfDescription(Cow::Owned(description.to_string())),
                // Nanosecond time stamps.
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        self.w.write_pcapng_block(idb)?;
        let id = self.ids.len() as u32;
        self.ids.insert(name.to_string(), id);
        Ok(id)
    }

    /// Writes one packet on interface `id`: `data` (maybe cut) of `orig_len` bytes.
    pub fn packet(
        &mut self,
        id: u32,
        time: Duration,
        data: &[u8],
        orig_len: u32,
        direction: Direction,
        comment: &str,
    ) -> anyhow::Result<()> {
        let mut options = vec![EnhancedPacketOption::Flags(direction as u32)];
        if !comment.is_empty() {
            options.push(EnhancedPacketOption::Comment(Cow::Borrowed(comment)));
        }
        let epb = EnhancedPacketBlock {
            interface_id: id,
            timestamp: time,
            original_len: orig_len,
            data: Cow::Borrowed(data),
            options,
        };
        self.w.write_pcapng_block(epb)?;
        Ok(())
    }

    /// Flushes what was written.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.w.get_mut().flush()
    }

    /// What it writes to (the recorder takes each block from a buffer to weigh it).
    pub fn get_mut(&mut self) -> &mut W {
        self.w.get_mut()
    }

    /// Writes an interface statistics block on interface `id` at `time` carrying `comment`:
    /// the note at a capture's end (why it was cut), which Wireshark shows with the
    /// capture's properties.
    pub fn note(&mut self, id: u32, time: Duration, comment: &str) -> anyhow::Result<()> {
        use pcap_file::pcapng::blocks::interface_statistics::{
            InterfaceStatisticsBlock, InterfaceStatisticsOption,
        };
        let ts = time.as_nanos() as u64;
        let isb = InterfaceStatisticsBlock {
            interface_id: id,
            timestamp: ts,
            options: vec![InterfaceStatisticsOption::Comment(Cow::Borrowed(comment))],
        };
        self.w.write_pcapng_block(isb)?;
        Ok(())
    }
}

/// The pcapng interface of a pod's veth: its name, `<pod> (<veth>)`, and its description
/// (the veth, the pod's addresses and labels).
pub fn pod_interface(p: &crate::views::PodView) -> (String, String) {
    let mut desc = format!("pod {} behind {} ({})", p.label(), p.interface, p.addresses.join(", "));
    if !p.labels.is_empty() {
        desc += &format!(", labels {}", crate::ctl::pods::labels_text(&p.labels));
    }
    (format!("{} ({})", p.label(), p.interface), desc)
}

/// A copy's comment: the rule that mirrored it (id, text: `None` when deleted since) and what
/// triggered (`a 500`); `replayed: ...` first for the request the classifier kept and sent
/// ahead of the trigger.
pub fn comment(rule: Option<(u32, Option<&str>, Option<&str>)>, replayed: bool) -> String {
    let comment = match rule {
        Some((r, text, on)) => {
            let text = text.unwrap_or("deleted since");
            let st = on.map_or(String::new(), |s| format!(", on {s}"));
            format!("mirrored by rule {r} ({text}){st}")
        }
        None => "rule unknown: the agent has no flow with this tuple".to_string(),
    };
    if replayed {
        return format!("replayed: the request before the trigger, kept by the classifier; {comment}");
    }
    comment
}

/// What triggered, as a copy's comment says it: `a 500`, `grpc 13 INTERNAL`, `reset`.
pub fn trigger_on(kind: Option<&str>, status: u16) -> String {
    match kind {
        None | Some("status") => format!("a {status}"),
        kind => crate::api::text::trigger_text(kind, status, None),
    }
}
