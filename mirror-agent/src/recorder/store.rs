//! The captures on the node's disk: one `<id>.pcapng` and its `<id>.json` (what the listing
//! shows) each, in a directory of mode 0700, files of mode 0600. It keeps them within the
//! budget (bytes, number, age): the oldest closed capture goes first; an open one that would
//! go beyond is refused more room (its writer cuts it). It never leaves less than
//! `min_free_bytes` free on the filesystem. A capture uploaded to object storage loses its
//! pcapng and keeps its metadata (listed, with its key) until the budget or its age takes it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::views::CaptureView;

/// The budget of the store.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Bytes of every file together.
    pub max_bytes: u64,
    /// Captures kept.
    pub max_captures: u32,
    /// Age of a closed capture (0: none).
    pub max_age: Duration,
    /// Free space left on the filesystem.
    pub min_free_bytes: u64,
}

/// A capture in the store.
struct Entry {
    view: CaptureView,
    /// Bytes of its two files on disk.
    bytes: u64,
    /// Of which its metadata's.
    meta: u64,
    /// When it was closed (`None`: open).
    closed: Option<SystemTime>,
}

/// What leaves no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_bytes`, with the open captures alone.
    Budget,
    /// The filesystem's free space, down to `min_free_bytes`.
    Disk,
}

/// What deleting a capture was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Room for newer ones.
    Budget,
    /// Older than `max_age`.
    Age,
    /// Asked (`captures rm`), or uploaded.
    Asked,
}

/// The directory and its captures.
pub struct Store {
    dir: PathBuf,
    budget: Budget,
    entries: BTreeMap<u64, Entry>,
    used: u64,
    /// Captures deleted for the budget or their age.
    deleted: u64,
    /// Of which, captures waiting for their upload.
    abandoned: u64,
    /// Free bytes on the filesystem when last asked, and when.
    free: (u64, Option<std::time::Instant>),
}

/// How often the filesystem's free space is asked again (in between, what was written since
/// is taken off the last answer).
const FREE_EVERY: Duration = Duration::from_millis(100);

fn json_of(v: &CaptureView) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(v).expect("captures serialize");
    b.push(b'\n');
    b
}

/// Whether `e` is closed and waits for its upload.
fn waits_upload(e: &Entry) -> bool {
    e.closed.is_some() && e.view.key.is_some() && !e.view.uploaded
}

/// Creates (or truncates) `path`, mode 0600, and writes `data`.
fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(data)
}

impl Store {
    /// Opens the directory (created with mode 0700 when absent, set to 0700 when not) and reads
    /// the captures left there: one still open when its agent stopped is said to be cut.
    pub fn open(dir: &Path, budget: Budget) -> io::Result<Store> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let mut s = Store {
            dir: dir.to_path_buf(),
            budget,
            entries: BTreeMap::new(),
            used: 0,
            deleted: 0,
            abandoned: 0,
            free: (0, None),
        };
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Some(id) = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let Ok(mut view) = std::fs::read(&path)
                .map_err(drop)
                .and_then(|b| serde_json::from_slice::<CaptureView>(&b).map_err(drop))
            else {
                tracing::warn!(file = %path.display(), "a capture's metadata that cannot be read: left alone");
                continue;
            };
            let pcap = s.pcap(id);
            let size = std::fs::metadata(&pcap).map_or(0, |m| m.len());
            if view.state == "open" {
                view.state = "cut".into();
                view.cut = Some("the agent stopped before its flow's mirror ended".into());
                view.bytes = size;
                let _ = write_private(&path, &json_of(&view));
            }
            let meta = std::fs::metadata(&path).map_or(0, |m| m.len());
            let closed = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
            s.used += size + meta;
            let closed = closed.or(Some(SystemTime::now()));
            s.entries.insert(id, Entry { view, bytes: size + meta, meta, closed });
        }
        Ok(s)
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pcapng file of capture `id`.
    pub fn pcap(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.pcapng"))
    }

    fn meta(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The highest id in the store.
    pub fn last_id(&self) -> u64 {
        self.entries.keys().next_back().copied().unwrap_or(0)
    }

    /// Captures deleted so far for the budget or their age.
    pub fn deleted(&self) -> u64 {
        self.deleted
    }

    /// Bytes on disk, all captures together.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The captures, oldest first.
    pub fn list(&self) -> Vec<CaptureView> {
        self.entries.values().map(|e| e.view.clone()).collect()
    }

    /// Capture `id`.
    pub fn get(&self, id: u64) -> Option<&CaptureView> {
        self.entries.get(&id).map(|e| &e.view)
    }

    /// Free bytes on the filesystem, asked at most every [`FREE_EVERY`].
    fn free(&mut self) -> u64 {
        if self.free.1.is_none_or(|at| at.elapsed() >= FREE_EVERY) {
            self.free = (self.statvfs(), Some(std::time::Instant::now()));
        }
        self.free.0
    }

    /// Free bytes on the directory's filesystem (for an unprivileged writer).
    fn statvfs(&self) -> u64 {
        let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) else { return u64::MAX };
        // SAFETY: zeroed is a valid statvfs; the call fills it from a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return u64::MAX;
        }
        st.f_bavail.saturating_mul(st.f_frsize)
    }

    /// Deletes the oldest closed capture other than `keep`; returns its id.
    fn evict_oldest(&mut self, keep: u64) -> Option<u64> {
        let id = self.entries.iter().find(|(id, e)| **id != keep && e.closed.is_some()).map(|(id, _)| *id)?;
        self.remove(id, Why::Budget);
        Some(id)
    }

    /// Room for `n` more bytes of capture `id`, deleting the oldest closed ones as needed.
    /// `false`: there is none (the open captures alone fill the budget, or the disk is full);
    /// [`Store::full`] says which.
    pub fn reserve(&mut self, id: u64, n: u64) -> bool {
        self.room(id, n).is_none()
    }

    /// What keeps `n` more bytes of capture `id` out, after deleting the oldest closed
    /// captures as needed (`None`: nothing, they fit).
    pub fn room(&mut self, id: u64, n: u64) -> Option<Full> {
        loop {
            // Each open capture keeps room for its end (its note, its metadata).
            let open = self.entries.values().filter(|e| e.closed.is_none()).count() as u64;
            let fits_budget = self.used + n + open * super::capture::TAIL <= self.budget.max_bytes;
            let fits_disk = self.free().saturating_sub(n) >= self.budget.min_free_bytes;
            if fits_budget && fits_disk {
                return None;
            }
            if self.evict_oldest(id).is_none() {
                return Some(if fits_budget { Full::Disk } else { Full::Budget });
            }
        }
    }

    /// Counts `n` bytes written to capture `id`.
    pub fn grow(&mut self, id: u64, n: u64) {
        self.used += n;
        self.free.0 = self.free.0.saturating_sub(n);
        if let Some(e) = self.entries.get_mut(&id) {
            e.bytes += n;
        }
    }

    /// Creates capture `id`'s file (mode 0600), making room for one more capture, and records
    /// `view` (open) with it.
    pub fn create(&mut self, id: u64, view: CaptureView) -> io::Result<File> {
        while self.entries.len() >= self.budget.max_captures as usize {
            if self.evict_oldest(id).is_none() {
                return Err(io::Error::other(format!(
                    "recorder.max_captures ({}) are all open",
                    self.budget.max_captures
                )));
            }
        }
        let data = json_of(&view);
        if !self.reserve(id, data.len() as u64) {
            return Err(io::Error::other("no room left within the budget"));
        }
        let f = OpenOptions::new().create(true).write(true).truncate(true).mode(0o600).open(self.pcap(id))?;
        if let Err(e) = write_private(&self.meta(id), &data) {
            let _ = std::fs::remove_file(self.pcap(id));
            return Err(e);
        }
        self.entries.insert(id, Entry { view, bytes: 0, meta: 0, closed: None });
        self.set_meta(id, data.len() as u64);
        Ok(f)
    }

    /// Records the size of capture `id`'s metadata, written again.
    fn set_meta(&mut self, id: u64, len: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            self.used = self.used.saturating_sub(e.meta) + len;
            e.bytes = e.bytes.saturating_sub(e.meta) + len;
            e.meta = len;
        }
    }

    /// Records capture `id` closed as `view`, its metadata written again.
    pub fn close(&mut self, id: u64, view: CaptureView) -> io::Result<()> {
        if let Some(e) = self.entries.get_mut(&id) {
            e.closed = Some(SystemTime::now());
        }
        self.update(id, |v| *v = view)
    }

    /// Changes capture `id`'s metadata (its packets and state; uploaded) and writes it again.
    pub fn update(&mut self, id: u64, f: impl FnOnce(&mut CaptureView)) -> io::Result<()> {
        let Some(e) = self.entries.get_mut(&id) else { return Ok(()) };
        f(&mut e.view);
        let data = json_of(&e.view);
        let grows = (data.len() as u64).saturating_sub(e.meta);
        if grows > 0 && !self.reserve(id, grows) {
            return Err(io::Error::other("no room left within the budget for the capture's metadata"));
        }
        write_private(&self.meta(id), &data)?;
        self.set_meta(id, data.len() as u64);
        Ok(())
    }

    /// Deletes capture `id`; returns whether it was there.
    pub fn remove(&mut self, id: u64, why: Why) -> bool {
        let Some(e) = self.entries.remove(&id) else { return false };
        let _ = std::fs::remove_file(self.pcap(id));
        let _ = std::fs::remove_file(self.meta(id));
        self.used = self.used.saturating_sub(e.bytes);
        if why != Why::Asked {
            self.deleted += 1;
            if waits_upload(&e) {
                self.abandoned += 1;
                tracing::warn!(
                    id,
                    ?why,
                    key = e.view.key.as_deref().unwrap_or(""),
                    "recorder: a capture deleted before it could be uploaded"
                );
            }
        }
        tracing::debug!(id, ?why, bytes = e.bytes, "capture deleted");
        true
    }

    /// Captures deleted for the budget or their age while they waited for their upload.
    pub fn abandoned(&self) -> u64 {
        self.abandoned
    }

    /// The closed captures that wait for their upload, oldest first: id and key.
    pub fn to_upload(&self) -> Vec<(u64, String)> {
        self.entries
            .iter()
            .filter(|(_, e)| waits_upload(e))
            .map(|(id, e)| (*id, e.view.key.clone().unwrap_or_default()))
            .collect()
    }

    /// Notes capture `id` stored in object storage: its pcapng is deleted, its metadata kept.
    pub fn uploaded(&mut self, id: u64) -> io::Result<()> {
        let Some(e) = self.entries.get_mut(&id) else { return Ok(()) };
        if e.view.uploaded {
            return Ok(());
        }
        let pcap = e.bytes.saturating_sub(e.meta);
        e.bytes -= pcap;
        let _ = std::fs::remove_file(self.pcap(id));
        self.used = self.used.saturating_sub(pcap);
        self.update(id, |v| {
            v.uploaded = true;
            v.upload_error = None;
        })
    }

    /// Deletes the closed captures older than `max_age`; returns how many.
    pub fn expire(&mut self, now: SystemTime) -> usize {
        if self.budget.max_age.is_zero() {
            return 0;
        }
        let old: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.closed.is_some_and(|c| now.duration_since(c).unwrap_or_default() > self.budget.max_age)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &old {
            self.remove(*id, Why::Age);
        }
        old.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64) -> CaptureView {
        CaptureView { id, state: "open".into(), ..CaptureView::default() }
    }

    fn budget(max_bytes: u64, max_captures: u32) -> Budget {
        Budget { max_bytes, max_captures, max_age: Duration::from_secs(60), min_free_bytes: 0 }
    }

    #[test]
    fn the_oldest_closed_capture_makes_room_and_an_open_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("c"), budget(12_000, 3)).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(s.dir()), 0o700);
        for id in 1..=3 {
            let mut f = s.create(id, view(id)).unwrap();
            assert!(s.reserve(id, 3000));
            f.write_all(&[0; 3000]).unwrap();
            s.grow(id, 3000);
            s.close(id, CaptureView { state: "complete".into(), ..view(id) }).unwrap();
            assert_eq!(mode(&s.pcap(id)), 0o600);
        }
        // Three captures: the fourth pushes the first out.
        let _f = s.create(4, view(4)).unwrap();
        let ids = |s: &Store| s.list().iter().map(|v| v.id).collect::<Vec<_>>();
        assert_eq!(ids(&s), [2, 3, 4]);
        assert!(!s.pcap(1).exists());
        // 4 grows: the oldest closed go first (room kept for its end), then it is refused.
        for want in [&[2, 3, 4][..], &[3, 4], &[4]] {
            assert!(s.reserve(4, 3000));
            s.grow(4, 3000);
            assert_eq!(ids(&s), want);
            assert!(s.used() + super::super::capture::TAIL <= 12_000, "{}", s.used());
        }
        assert!(!s.reserve(4, 3000));
        // Read back by a new store: the open one is said to be cut.
        let used = s.used();
        drop(s);
        let s = Store::open(&dir.path().join("c"), budget(12_000, 3)).unwrap();
        let v = s.list();
        assert_eq!((v.len(), v[0].state.as_str()), (1, "cut"), "{v:?}");
        // What is on disk (4's packets were counted, never written here).
        let on_disk: u64 =
            std::fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert_eq!(s.used(), on_disk);
        assert!(used > on_disk);
    }

    #[test]
    fn an_uploaded_capture_keeps_its_listing_and_frees_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path(), budget(1 << 20, 10)).unwrap();
        let keyed = |id| CaptureView { key: Some(format!("k/{id}")), ..view(id) };
        for id in 1..=2 {
            let mut f = s.create(id, keyed(id)).unwrap();
            assert!(s.reserve(id, 5000));
            f.write_all(&[0; 5000]).unwrap();
            s.grow(id, 5000);
        }
        // Only closed ones wait.
        assert!(s.to_upload().is_empty());
        s.close(1, CaptureView { state: "complete".into(), ..keyed(1) }).unwrap();
        assert_eq!(s.to_upload(), [(1, "k/1".to_string())]);
        let before = s.used();
        s.uploaded(1).unwrap();
        assert!(!s.pcap(1).exists() && s.get(1).unwrap().uploaded);
        assert!(s.used() <= before - 5000 + 64, "{} of {before}", s.used());
        assert!(s.to_upload().is_empty());
        // Read back: still uploaded; the other, closed by the restart, waits.
        drop(s);
        let s = Store::open(dir.path(), budget(1 << 20, 10)).unwrap();
        assert!(s.get(1).unwrap().uploaded);
        assert_eq!(s.to_upload(), [(2, "k/2".to_string())]);
        let on_disk: u64 =
            std::fs::read_dir(s.dir()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        assert_eq!(s.used(), on_disk);
    }

    #[test]
    fn closed_captures_age_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path(), budget(1 << 20, 10)).unwrap();
        s.create(1, view(1)).unwrap();
        s.close(1, view(1)).unwrap();
        s.create(2, view(2)).unwrap();
        assert_eq!(s.expire(SystemTime::now()), 0);
        assert_eq!(s.expire(SystemTime::now() + Duration::from_secs(61)), 1);
        assert_eq!(s.list().iter().map(|v| v.id).collect::<Vec<_>>(), [2]);
        assert_eq!(s.last_id(), 2);
    }
}
