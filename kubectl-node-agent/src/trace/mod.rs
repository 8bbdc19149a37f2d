//! `kubectl node-agent trace`: the live stream of every selected node's agent, merged in
//! time order with a node column. The agent pods are watched: an agent that joins (a new
//! node, a restarted pod) is followed from then on, one that leaves is said so, and neither
//! ends the command; a broken stream is opened again while its pod runs. Only a refusal by
//! RBAC ends it early: that is the user's to fix.

pub mod merge;
pub mod output;
pub mod select;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    time::{Duration, SystemTime},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    runtime::{watcher, WatchStreamExt as _},
    Api,
};
use node_agent::trace::Record;
use tokio::{sync::mpsc, task::AbortHandle};

use self::{
    merge::Merger,
    output::{Format, Line, Notice, NoticeKind},
    select::{Nodes, Records},
};
use crate::{
    cluster::{AgentPod, Cluster, AGENT_SELECTOR},
    error::{Call, PluginError},
    forward::{self, ForwardError, Lines},
};

/// A stream that carried nothing, not even the agent's keepalive (every 15 s), for this long
/// is taken as broken and opened again.
const STALLED: Duration = Duration::from_secs(45);
/// Pauses between attempts to open an agent's stream: doubling up to the last.
const RETRY: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// Only the agents of these nodes (repeatable, or comma-separated).
    #[arg(long, value_name = "NODE")]
    pub node: Vec<String>,
    /// Only the agents of the nodes this label selector picks (e.g. `-l pool=batch`); kept
    /// current while the trace runs.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Only records about pods of this namespace (node-wide records pass).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Only records about the pod of this name (with -n, in that namespace).
    #[arg(long, value_name = "NAME")]
    pub pod: Option<String>,
    /// Only these kinds (repeatable, or comma-separated): oom_kill, memory_threshold,
    /// pid_threshold, fork_storm, eviction, reclaim, events_lost (stream_lost, a gap in an
    /// agent's stream to this reader, always passes).
    #[arg(long, value_name = "KIND")]
    pub kind: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Stop after this long (a duration such as 30s or 5m); default: until Ctrl-C.
    #[arg(long, value_name = "DURATION", value_parser = crate::stop::duration)]
    pub timeout: Option<Duration>,
}

/// What the watchers and the stream tasks tell the main loop.
enum Event {
    Line { node: String, line: Line },
    Pods(Box<watcher::Event<Pod>>),
    Nodes(Box<watcher::Event<Node>>),
    Fatal(PluginError),
}

pub async fn run(cluster: Cluster, args: &TraceArgs) -> Result<(), PluginError> {
    // Every flag is checked before anything is asked of the cluster.
    let records = Records::new(&args.kind, args.namespace.as_deref(), args.pod.as_deref())?;
    let mut nodes = Nodes {
        named: select::node_names(&args.node)?,
        labelled: None,
    };
    if let Some(selector) = &args.selector {
        // The first answer here, so a bad selector or a missing grant is said at once.
        nodes.labelled = Some(cluster.nodes(selector).await?);
    }
    let (tx, mut rx) = mpsc::channel::<Event>(1024);
    let mut tasks = Vec::new();
    if let Some(selector) = &args.selector {
        let api: Api<Node> = Api::all(cluster.client.clone());
        let config = watcher::Config::default().labels(selector);
        tasks.push(tokio::spawn(forward_watch(
            watcher(api, config).default_backoff().boxed(),
            tx.clone(),
            |e| Event::Nodes(Box::new(e)),
            Call::new("watch", "nodes", None, "watching the nodes -l picks"),
        )));
    }
    let pods = watcher(
        cluster.agent_pods(),
        watcher::Config::default().labels(AGENT_SELECTOR),
    )
    .default_backoff()
    .boxed();
    tasks.push(tokio::spawn(forward_watch(
        pods,
        tx.clone(),
        |e| Event::Pods(Box::new(e)),
        Call::new(
            "watch",
            "pods",
            Some(&cluster.agent_namespace),
            "watching the agent pods",
        ),
    )));

    let mut out = Output::new(args.output)?;
    let mut merger: Merger<Line> = Merger::new(merge::HOLD);
    let mut agents: BTreeMap<String, AgentPod> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, AgentPod>> = None;
    let mut node_listing: Option<BTreeSet<String>> = None;
    let mut following = Following::default();
    let mut said_none = false;
    let mut stop = crate::stop::Stop::new(args.timeout);
    let target = records.target();
    let result = loop {
        let wait = merger
            .next_due()
            .map(|due| Duration::from_nanos(u64::try_from((due - now()).max(0)).unwrap_or(0)));
        tokio::select! {
            event = rx.recv() => {
                let Some(event) = event else { break Ok(()) };
                match event {
                    Event::Fatal(e) => break Err(e),
                    Event::Line { node, line } => {
                        let keep = match &line {
                            Line::Record(r) => records.keeps(r),
                            Line::Notice(_) => true,
                        };
                        if keep {
                            let arrived = now();
                            let at = output::time_of(&line).unwrap_or(arrived);
                            merger.push(&node, at, line, arrived);
                        }
                    }
                    Event::Pods(e) => {
                        apply(*e, &mut agents, &mut listing, |p| {
                            let a = AgentPod::of(p);
                            (a.name.clone(), a)
                        });
                        if listing.is_none() {
                            following.reconcile(&agents, &nodes, &cluster, &target, &tx);
                            if following.is_empty() && !said_none {
                                eprintln!(
                                    "kubectl node-agent: no agent to follow yet{} (namespace {}); waiting for one to join",
                                    nodes.said(args.selector.as_deref()),
                                    cluster.agent_namespace
                                );
                                said_none = true;
                            }
                        }
                    }
                    Event::Nodes(e) => {
                        let mut labelled = nodes.labelled.take().unwrap_or_default();
                        apply_set(*e, &mut labelled, &mut node_listing);
                        nodes.labelled = Some(labelled);
                        if node_listing.is_none() {
                            following.reconcile(&agents, &nodes, &cluster, &target, &tx);
                        }
                    }
                }
            }
            () = sleep_for(wait) => {}
            () = stop.wait() => break Ok(()),
        }
        for t in merger.due(now()) {
            if !out.print(&t.node, &t.line)? {
                break;
            }
        }
        if out.closed {
            break Ok(());
        }
    };
    for t in merger.drain() {
        out.print(&t.node, &t.line)?;
    }
    following.stop_all();
    for task in tasks {
        task.abort();
    }
    result
}

fn now() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Now, as the agents write their times (microseconds, UTC).
fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Carries a watcher's events to the loop; a refusal ends the command, other errors are
/// retried by the watcher's own backoff.
async fn forward_watch<K, S>(
    mut stream: S,
    tx: mpsc::Sender<Event>,
    wrap: fn(watcher::Event<K>) -> Event,
    call: Call,
) where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(e) => wrap(e),
            Err(error) => {
                let (kube_error, verb) = match error {
                    watcher::Error::InitialListFailed(e) => (e, "list"),
                    watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
                        (e, "watch")
                    }
                    watcher::Error::WatchError(status) => (kube::Error::Api(status), "watch"),
                    watcher::Error::NoResourceVersion => continue,
                };
                let call = Call {
                    verb,
                    ..call.clone()
                };
                match call.failed(kube_error) {
                    e if e.is_forbidden() => Event::Fatal(e),
                    e => {
                        eprintln!("kubectl node-agent: {e} (retrying)");
                        continue;
                    }
                }
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

/// Applies a watcher event to a map keyed by name; `listing` holds a relist in progress.
fn apply<K, T: Clone>(
    event: watcher::Event<K>,
    current: &mut BTreeMap<String, T>,
    listing: &mut Option<BTreeMap<String, T>>,
    of: impl Fn(&K) -> (String, T),
) {
    match event {
        watcher::Event::Init => *listing = Some(BTreeMap::new()),
        watcher::Event::InitApply(k) => {
            let (name, v) = of(&k);
            listing.get_or_insert_with(BTreeMap::new).insert(name, v);
        }
        watcher::Event::InitDone => {
            if let Some(done) = listing.take() {
                *current = done;
            }
        }
        watcher::Event::Apply(k) => {
            let (name, v) = of(&k);
            current.insert(name, v);
        }
        watcher::Event::Delete(k) => {
            current.remove(&of(&k).0);
        }
    }
}

fn apply_set(
    event: watcher::Event<Node>,
    current: &mut BTreeSet<String>,
    listing: &mut Option<BTreeSet<String>>,
) {
    let name = |n: &Node| n.metadata.name.clone().unwrap_or_default();
    match event {
        watcher::Event::Init => *listing = Some(BTreeSet::new()),
        watcher::Event::InitApply(n) => {
            listing.get_or_insert_with(BTreeSet::new).insert(name(&n));
        }
        watcher::Event::InitDone => {
            if let Some(done) = listing.take() {
                *current = done;
            }
        }
        watcher::Event::Apply(n) => {
            current.insert(name(&n));
        }
        watcher::Event::Delete(n) => {
            current.remove(&name(&n));
        }
    }
}

/// The agents whose streams are followed, by pod name.
#[derive(Default)]
struct Following {
    streams: BTreeMap<String, (String, AbortHandle)>,
}

impl Following {
    fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Follows every reachable agent on a selected node, and lets go of the rest.
    fn reconcile(
        &mut self,
        agents: &BTreeMap<String, AgentPod>,
        nodes: &Nodes,
        cluster: &Cluster,
        target: &str,
        tx: &mpsc::Sender<Event>,
    ) {
        let wanted: BTreeMap<&String, &AgentPod> = agents
            .iter()
            .filter(|(_, a)| a.reachable() && nodes.selects(a.node_name()))
            .collect();
        let gone: Vec<String> = self
            .streams
            .keys()
            .filter(|name| !wanted.contains_key(name))
            .cloned()
            .collect();
        for name in gone {
            if let Some((node, handle)) = self.streams.remove(&name) {
                handle.abort();
                let why = match agents.get(&name) {
                    None => "its pod was deleted".to_string(),
                    Some(a) if a.deleting => "its pod is terminating".to_string(),
                    Some(a) if !nodes.selects(a.node_name()) => {
                        "its node is no longer selected".to_string()
                    }
                    Some(a) => format!("its pod is {}", a.phase),
                };
                let _ = tx.try_send(Event::Line {
                    node,
                    line: notice(NoticeKind::Left, &name, why),
                });
            }
        }
        for (name, agent) in wanted {
            if self.streams.contains_key(name) {
                continue;
            }
            let node = agent.node_name().to_string();
            let task = tokio::spawn(follow(
                cluster.clone(),
                agent.clone(),
                target.to_string(),
                tx.clone(),
            ));
            self.streams
                .insert(name.clone(), (node, task.abort_handle()));
        }
    }

    fn stop_all(&mut self) {
        for (_, (_, handle)) in std::mem::take(&mut self.streams) {
            handle.abort();
        }
    }
}

fn notice(kind: NoticeKind, pod: &str, detail: String) -> Line {
    Line::Notice(Notice {
        kind,
        time: now_rfc3339(),
        pod: pod.to_string(),
        detail,
    })
}

/// Follows one agent's stream for as long as the task lives: opened again after a break,
/// with a pause that grows; each episode said once.
async fn follow(cluster: Cluster, agent: AgentPod, target: String, tx: mpsc::Sender<Event>) {
    let node = agent.node_name().to_string();
    let send = |line: Line| {
        let tx = tx.clone();
        let node = node.clone();
        async move { tx.send(Event::Line { node, line }).await.is_ok() }
    };
    let mut failures = 0usize;
    let mut unreachable_said = false;
    loop {
        match forward::open(&cluster, &agent.name, &target).await {
            Ok(open) => {
                failures = 0;
                unreachable_said = false;
                let detail = format!(
                    "following its stream ({})",
                    agent.daemonset.as_deref().unwrap_or("no DaemonSet")
                );
                if !send(notice(NoticeKind::Joined, &agent.name, detail)).await {
                    return;
                }
                let why = read_stream(Lines::new(open), &send).await;
                match why {
                    None => return,
                    Some(why) => {
                        if !send(notice(NoticeKind::Left, &agent.name, why)).await {
                            return;
                        }
                    }
                }
            }
            Err(ForwardError::Refused(e)) => {
                let _ = tx.send(Event::Fatal(e)).await;
                return;
            }
            Err(ForwardError::Failed(why)) => {
                failures += 1;
                if !unreachable_said {
                    unreachable_said = true;
                    let detail = format!("{why} (trying again while its pod runs)");
                    if !send(notice(NoticeKind::Unreachable, &agent.name, detail)).await {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(RETRY[failures.min(RETRY.len() - 1)]).await;
    }
}

/// Carries one open stream's records until it ends; says why it ended (`None`: the loop is
/// gone).
async fn read_stream<F, Fut>(mut lines: Lines, send: &F) -> Option<String>
where
    F: Fn(Line) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        let line = match tokio::time::timeout(STALLED, lines.next()).await {
            Err(_) => {
                return Some(format!(
                    "its stream carried nothing for {STALLED:?}, not even a keepalive (opening it again)"
                ))
            }
            Ok(Err(e)) => return Some(format!("its stream broke: {e} (opening it again)")),
            Ok(Ok(None)) => return Some("its stream ended (opening it again)".into()),
            Ok(Ok(Some(line))) => line,
        };
        if line.is_empty() {
            continue;
        }
        let line = match serde_json::from_str::<Record>(&line) {
            Ok(record) => Line::Record(Box::new(record)),
            Err(e) => {
                eprintln!("kubectl node-agent: a line this plugin cannot read (a different version?): {e}");
                continue;
            }
        };
        if !send(line).await {
            return None;
        }
    }
}

/// Standard output; a reader that went away (`| head`) ends the trace quietly.
struct Output {
    format: Format,
    closed: bool,
}

impl Output {
    fn new(format: Format) -> Result<Output, PluginError> {
        let mut out = Output {
            format,
            closed: false,
        };
        if let Some(header) = output::header(format) {
            out.write(&header)?;
        }
        Ok(out)
    }

    /// Whether the output still takes lines.
    fn print(&mut self, node: &str, line: &Line) -> Result<bool, PluginError> {
        if self.closed {
            return Ok(false);
        }
        self.write(&output::render(node, line, self.format))?;
        Ok(!self.closed)
    }

    fn write(&mut self, text: &str) -> Result<(), PluginError> {
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(PluginError::Output(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kind_help_names_every_kind_the_agent_knows() {
        use clap::Args as _;
        let command = super::TraceArgs::augment_args(clap::Command::new("trace"));
        assert_eq!(
            node_agent::trace::kinds_left_out_of_help(&command),
            Vec::<&str>::new()
        );
    }
}
