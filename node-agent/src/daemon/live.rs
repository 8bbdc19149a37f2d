//! The daemon's live view: every trace record, as a JSON line, to every client of a Unix
//! socket. `node-agent trace` attaches here instead of loading a second copy of the programs.

use std::{path::Path, sync::Arc};

use tokio::{
    io::AsyncWriteExt as _,
    net::{UnixListener, UnixStream},
    sync::broadcast,
};

use crate::trace::Record;

/// Records queued per client before it counts as too slow (its losses are reported to it).
const CLIENT_BACKLOG: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("another node-agent is already serving {path}")]
    InUse { path: String },
    #[error("creating the trace socket {path}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Publishes records to attached `trace` clients.
#[derive(Clone)]
pub struct Live {
    tx: broadcast::Sender<Arc<str>>,
}

impl Live {
    /// Binds the socket (replacing a stale one left by a crashed agent) and starts accepting.
    pub async fn bind(path: &Path) -> Result<(Live, tokio::task::JoinHandle<()>), LiveError> {
        let shown = path.display().to_string();
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(LiveError::InUse { path: shown });
            }
            let _ = std::fs::remove_file(path);
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| LiveError::Bind {
                path: shown.clone(),
                source,
            })?;
        }
        let listener = UnixListener::bind(path).map_err(|source| LiveError::Bind {
            path: shown,
            source,
        })?;
        let (tx, _) = broadcast::channel(CLIENT_BACKLOG);
        let live = Live { tx };
        let accept = live.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_client(stream, accept.tx.subscribe()));
                    }
                    Err(e) => tracing::warn!(error = %e, "trace socket accept"),
                }
            }
        });
        Ok((live, task))
    }

    /// Prints every record on stdout as well (`node-agent run --trace`).
    pub fn print(&self, format: crate::trace::OutputFormat) {
        let mut rx = self.tx.subscribe();
        tokio::spawn(async move {
            use std::io::Write as _;
            if format == crate::trace::OutputFormat::Table {
                println!("{}", Record::TABLE_HEADER);
            }
            loop {
                let line = match rx.recv().await {
                    Ok(line) => line,
                    Err(broadcast::error::RecvError::Lagged(n)) => Arc::from(
                        Record::EventsLost {
                            time: String::new(),
                            lost: n,
                            total_per_cpu: Vec::new(),
                        }
                        .json(),
                    ),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let text = match format {
                    crate::trace::OutputFormat::Json => line.to_string(),
                    crate::trace::OutputFormat::Table => {
                        match serde_json::from_str::<Record>(&line) {
                            Ok(rec) => rec.table_row(),
                            Err(_) => line.to_string(),
                        }
                    }
                };
                let mut out = std::io::stdout().lock();
                if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
                    return;
                }
            }
        });
    }

    pub fn publish(&self, record: &Record) {
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(Arc::from(record.json()));
    }
}

async fn serve_client(mut stream: UnixStream, mut rx: broadcast::Receiver<Arc<str>>) {
    loop {
        let line = match rx.recv().await {
            Ok(line) => line,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                let rec = Record::EventsLost {
                    time: String::new(),
                    lost: n,
                    total_per_cpu: Vec::new(),
                };
                Arc::from(rec.json())
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if stream.write_all(line.as_bytes()).await.is_err()
            || stream.write_all(b"\n").await.is_err()
        {
            return;
        }
    }
}
