//! Closed captures shipped to S3-compatible object storage (`recorder.upload`), one at a time,
//! oldest first, through `object_store`'s S3 client (SigV4, the AWS credential chain).
//!
//! An attempt first asks whether the object is there already (HEAD, its size): a PUT whose
//! answer was lost, or an agent stopped between storing a capture and noting it, is then not
//! sent again. A failed attempt is reported and the same capture tried again after a wait
//! that doubles from `retry_min` to `retry_max`; the client's own retries are off, so every
//! request sent is one this loop decided on. The recorder's task deletes the local file when
//! told the capture is stored.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AwsCredential};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, CredentialProvider, ObjectStore, ObjectStoreExt, RetryConfig,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::Msg;
use crate::config::{Upload, KEY_ID_FILE, SECRET_FILE, TOKEN_FILE};

/// Where captures go in the bucket:
/// `[prefix/]<cluster>/<node>/<namespace>/<pod>/<time>-<id>.pcapng`, `<time>` the trigger's
/// (UTC, `20261126T115802.114Z`); a pod whose namespace is not known (named from `/proc`) is
/// under `_/<pod>`, a trigger of no known pod under `_host/<interface>`.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    /// `[prefix/]<cluster>/<node>`.
    base: String,
}

impl KeyLayout {
    /// The layout of `cfg` for node `node`.
    pub fn new(cfg: &Upload, node: &str) -> KeyLayout {
        let prefix = cfg.prefix.trim_end_matches('/');
        let node = if node.is_empty() { "_node" } else { node };
        let base = if prefix.is_empty() {
            format!("{}/{node}", cfg.cluster)
        } else {
            format!("{prefix}/{}/{node}", cfg.cluster)
        };
        KeyLayout { base }
    }

    /// The key of capture `id`, of a trigger at `time` (RFC 3339) on `pod` (`namespace/name`,
    /// or a name alone when its namespace is not known), else on `interface`.
    pub fn key(&self, id: u64, time: &str, pod: Option<&str>, interface: &str) -> String {
        let clean = |s: &str| -> String {
            s.chars().map(|c| if c.is_ascii_graphic() && c != '/' { c } else { '_' }).collect()
        };
        let place = match pod.map(|p| p.split_once('/').unwrap_or(("_", p))) {
            Some((ns, name)) => format!("{}/{}", clean(ns), clean(name)),
            None => format!("_host/{}", clean(interface)),
        };
        let stamp: String = time.chars().filter(|c| *c != '-' && *c != ':').collect();
        format!("{}/{place}/{}-{id}.pcapng", self.base, clean(&stamp))
    }
}

/// A capture to upload.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: u64,
    pub path: PathBuf,
    pub key: String,
}

/// What an attempt did, reported to the recorder's task.
#[derive(Debug)]
pub enum Done {
    /// Stored (`sent`: by this attempt's PUT; else it was there already), `bytes` long.
    Stored { id: u64, bytes: u64, sent: bool },
    /// The attempt failed; it is tried again.
    Failed { id: u64, error: String },
    /// Its file is gone (deleted for the budget, or by `captures rm`): given up.
    Gone { id: u64 },
}

/// Credentials read from a mounted Secret's files at each request's signing (a rotated Secret
/// is followed).
#[derive(Debug)]
struct SecretFiles(PathBuf);

#[async_trait::async_trait]
impl CredentialProvider for SecretFiles {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let read = |f: &str| -> object_store::Result<Option<String>> {
            let path = self.0.join(f);
            match std::fs::read_to_string(&path) {
                Ok(s) => Ok(Some(s.trim().to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && f == TOKEN_FILE => Ok(None),
                Err(e) => Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!("reading {}: {e}", path.display()).into(),
                }),
            }
        };
        Ok(Arc::new(AwsCredential {
            key_id: read(KEY_ID_FILE)?.unwrap_or_default(),
            secret_key: read(SECRET_FILE)?.unwrap_or_default(),
            token: read(TOKEN_FILE)?.filter(|t| !t.is_empty()),
        }))
    }
}

/// The S3 client of `cfg`.
pub fn client(cfg: &Upload) -> anyhow::Result<Arc<dyn ObjectStore>> {
    // rustls's provider for the client's TLS: ring, as the Kubernetes client's (set once per
    // process; a second time is refused, harmlessly).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(&cfg.bucket)
        .with_region(&cfg.region)
        .with_virtual_hosted_style_request(cfg.virtual_hosted)
        .with_retry(RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 0,
            retry_timeout: cfg.timeout,
        })
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(cfg.endpoint.starts_with("http://"))
                .with_timeout(cfg.timeout)
                .with_connect_timeout(Duration::from_secs(10)),
        );
    if !cfg.endpoint.is_empty() {
        b = b.with_endpoint(&cfg.endpoint);
    }
    if !cfg.credentials_dir.is_empty() {
        b = b.with_credentials(Arc::new(SecretFiles(PathBuf::from(&cfg.credentials_dir))));
    }
    Ok(Arc::new(b.build()?))
}

/// Bytes a PUT holds at most; a larger capture goes in parts of this size, two at a time.
const PART: usize = 8 << 20;

/// One attempt at `job`: whether the object is there at its size, else a PUT of the file.
async fn attempt(store: &Arc<dyn ObjectStore>, job: &Job) -> Result<Done, String> {
    let mut file = match tokio::fs::File::open(&job.path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Done::Gone { id: job.id }),
        Err(e) => return Err(format!("reading {}: {e}", job.path.display())),
    };
    let bytes = file.metadata().await.map_err(|e| e.to_string())?.len();
    let key = Path::from(job.key.as_str());
    match store.head(&key).await {
        Ok(meta) if meta.size == bytes => return Ok(Done::Stored { id: job.id, bytes, sent: false }),
        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(error_text(&e)),
    }
    let mut w = BufWriter::with_capacity(store.clone(), key, PART).with_max_concurrency(2);
    let sent = async {
        tokio::io::copy(&mut file, &mut w).await?;
        w.shutdown().await
    }
    .await;
    match sent {
        Ok(()) => Ok(Done::Stored { id: job.id, bytes, sent: true }),
        Err(e) => {
            let _ = w.abort().await;
            Err(e.to_string())
        }
    }
}

/// An error's text with its causes (object_store's top line alone says little).
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !text.contains(&s) {
            text = format!("{text}: {s}");
        }
        cause = c.source();
    }
    text
}

/// The uploader's handle: captures are queued to it.
#[derive(Clone)]
pub struct Uploader {
    tx: mpsc::UnboundedSender<Job>,
}

impl Uploader {
    /// Starts the uploader of `cfg`; what it does goes to the recorder's task through `back`.
    pub(super) fn start(cfg: &Upload, back: mpsc::UnboundedSender<Msg>) -> anyhow::Result<Uploader> {
        let store = client(cfg)?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let (min, max) = (cfg.retry_min, cfg.retry_max);
        tokio::spawn(async move {
            let mut wait = min;
            while let Some(job) = rx.recv().await {
                loop {
                    match attempt(&store, &job).await {
                        Ok(done) => {
                            wait = min;
                            let _ = back.send(Msg::Uploaded(done));
                            break;
                        }
                        Err(error) => {
                            tracing::debug!(id = job.id, key = %job.key, %error, retry_in = ?wait, "recorder: upload failed");
                            if back.send(Msg::Uploaded(Done::Failed { id: job.id, error })).is_err() {
                                return;
                            }
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(max);
                        }
                    }
                }
            }
        });
        Ok(Uploader { tx })
    }

    /// Queues capture `id`'s file `path` for `key`.
    pub fn queue(&self, id: u64, path: &FsPath, key: &str) {
        let _ = self.tx.send(Job { id, path: path.to_path_buf(), key: key.to_string() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_cluster_node_namespace_pod_time_and_id() {
        let cfg = Upload { prefix: "mirror/".into(), cluster: "prod-eu".into(), ..Upload::default() };
        let k = KeyLayout::new(&cfg, "node-a");
        assert_eq!(
            k.key(17, "2026-11-26T11:58:02.114Z", Some("shop/checkout-7d9f"), "veth3a1f"),
            "mirror/prod-eu/node-a/shop/checkout-7d9f/20261126T115802.114Z-17.pcapng"
        );
        let bare = KeyLayout::new(&Upload::default(), "n1");
        assert_eq!(
            bare.key(3, "2026-11-26T11:58:02.114Z", None, "veth-tour"),
            "default/n1/_host/veth-tour/20261126T115802.114Z-3.pcapng"
        );
        assert_eq!(
            bare.key(4, "2026-11-26T11:58:02.114Z", Some("tour"), "veth-tour"),
            "default/n1/_/tour/20261126T115802.114Z-4.pcapng"
        );
    }
}
