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
}
