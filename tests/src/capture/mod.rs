//! What a test saw: tcpdump captures and their pcap files, tshark's reading of them, the mirror
//! watched as it happens, and what an agent holds (its footprint).

pub mod footprint;
pub mod mirror_watch;
pub mod pcap;
pub mod tcpdump;
pub mod tshark;
