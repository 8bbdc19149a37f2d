//! The agent's logs: `tracing` events on stderr, as text (the default) or as JSON lines with
//! the same fields (`--log-format json`, `logFormat: json`), filtered by a level or by
//! `RUST_LOG` directives (`--log-level`, `RUST_LOG`, `logLevel`).
//!
//! The command line wins over the config file: `--log-level`, else `RUST_LOG` (the same
//! syntax), else the file's `logLevel`, else `info`; `--log-format`, else the file's
//! `logFormat`, else `text`. What the file says is applied when the daemon has read it
//! ([`configure`]) and again at every reload, so a reload changes the level or the format of
//! an agent that has no flag for them.
//!
//! A JSON line is one object: `timestamp` (RFC 3339, UTC), `level`, `target` (the module),
//! `message`, then the event's own fields at the top level (`pod`, `signal`, `result`, ...),
//! exactly those the text line prints as `key=value`.

use std::{
    fmt,
    str::FromStr,
    sync::{Mutex, OnceLock},
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tracing_subscriber::{
    fmt::MakeWriter, layer::SubscriberExt as _, reload, util::SubscriberInitExt as _, EnvFilter,
    Layer, Registry,
};

/// How each log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `2025-01-01T00:00:00.000000Z  INFO node_agent::run::report: evicted pod=shop/web ...`
    #[default]
    Text,
    /// One JSON object per line, the event's fields at the top level.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Which events are written: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`) or
/// `RUST_LOG` directives (`info,node_agent::run=debug`), checked when read. Directives naming
/// the agent's modules before they were cut by part (`node_agent::daemon`, `…::daemon::report`)
/// still select the same events: see [`MOVED`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLevel(String);

/// The levels a directive may be on its own.
const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// A `logLevel`, `--log-level` or `RUST_LOG` that is not a filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a log level or filter: expected error, warn, info, debug, trace or off, or RUST_LOG directives such as info,node_agent=debug ({problem})")]
pub struct LogLevelError {
    text: String,
    problem: String,
}

impl LogLevel {
    pub fn info() -> Self {
        Self("info".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `RUST_LOG` as `tracing`'s EnvFilter reads it, bare targets (`RUST_LOG=node_agent`: that
    /// target at every level) included; only what EnvFilter refuses is refused.
    pub fn from_rust_log(text: &str) -> Result<Self, LogLevelError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(LogLevelError {
                text: text.to_string(),
                problem: "empty".into(),
            });
        }
        EnvFilter::builder()
            .parse(trimmed)
            .map_err(|e| LogLevelError {
                text: text.to_string(),
                problem: e.to_string(),
            })?;
        Ok(Self(trimmed.to_string()))
    }

    fn filter(&self) -> EnvFilter {
        EnvFilter::builder()
            .parse(retargeted(&self.0))
            .expect("a LogLevel was parsed when it was made, and retargeting keeps its syntax")
    }
}

/// Where the modules of `node_agent::daemon` went when the agent crate was cut by part, so a
/// `logLevel` or `RUST_LOG` written for the old log targets selects the same events.
pub const MOVED: &[(&str, &str)] = &[
    ("config", "node_agent::config"),
    ("kubelet", "node_agent::config::kubelet"),
    ("reload", "node_agent::config::reload"),
    ("node", "node_agent::observe::node"),
    ("probe", "node_agent::observe::fs_probe"),
    ("allocatable", "node_agent::observe::allocatable"),
    ("pid_limit", "node_agent::observe::pid_limit"),
    ("triggers", "node_agent::observe::triggers"),
    ("feed", "node_agent::observe::feed"),
    ("pods", "node_agent::observe::pods"),
    ("naming", "node_agent::observe::naming"),
    ("live", "node_agent::serve::live"),
];

/// The directives with each target under `node_agent::daemon` replaced by where its module
/// went: a module named in [`MOVED`] by its new path, any other by `node_agent::run::…`, and
/// `node_agent::daemon` itself by every part it was cut into.
fn retargeted(directives: &str) -> String {
    const OLD: &str = "node_agent::daemon";
    let parts = [
        "node_agent::run",
        "node_agent::config",
        "node_agent::observe",
        "node_agent::serve",
        "node_agent::check_config",
    ];
    let mut out = Vec::new();
    for directive in directives.split(',') {
        let Some(rest) = directive.trim().strip_prefix(OLD) else {
            out.push(directive.to_string());
            continue;
        };
        match rest.strip_prefix("::") {
            Some(inner) => {
                let module = inner
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or_default();
                let tail = &inner[module.len()..];
                let new = MOVED.iter().find(|(m, _)| *m == module).map_or_else(
                    || format!("node_agent::run::{module}"),
                    |(_, n)| n.to_string(),
                );
                out.push(format!("{new}{tail}"));
            }
            None if rest.is_empty() || rest.starts_with(['=', '[']) => {
                out.extend(parts.iter().map(|p| format!("{p}{rest}")));
            }
            // `node_agent::daemonic`: not the old module.
            None => out.push(directive.to_string()),
        }
    }
    out.join(",")
}

impl Default for LogLevel {
    fn default() -> Self {
        Self::info()
    }
}

impl FromStr for LogLevel {
    type Err = LogLevelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refused = |problem: String| LogLevelError {
            text: text.to_string(),
            problem,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(refused("empty".into()));
        }
        // A bare word is a target at every level to EnvFilter, so a misspelt level (`inof`)
        // would silently log nothing else: a directive without `=` must be a level.
        for directive in trimmed.split(',').map(str::trim) {
            let bare = !directive.contains('=') && !directive.contains('[');
            if bare && !LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
                return Err(refused(format!(
                    "{directive:?} is neither a level nor TARGET=LEVEL"
                )));
            }
        }
        EnvFilter::builder()
            .parse(trimmed)
            .map_err(|e| refused(e.to_string()))?;
        Ok(Self(trimmed.to_string()))
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What the command line says about logs; `None` leaves it to the config file.
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    pub format: Option<LogFormat>,
    pub level: Option<LogLevel>,
}

impl CommandLine {
    /// The format and level in force: the command line's where it gives them, else the file's.
    pub fn over(&self, format: LogFormat, level: &LogLevel) -> (LogFormat, LogLevel) {
        (
            self.format.unwrap_or(format),
            self.level.clone().unwrap_or_else(|| level.clone()),
        )
    }
}

/// The formatting layer, boxed so that a reload can swap text for JSON.
type Formatter = Box<dyn Layer<Registry> + Send + Sync>;
type FormatterLayer = reload::Layer<Formatter, Registry>;
type Filtered = tracing_subscriber::layer::Layered<FormatterLayer, Registry>;

/// The installed subscriber's switches and what the command line fixed.
struct Installed {
    formatter: reload::Handle<Formatter, Registry>,
    filter: reload::Handle<EnvFilter, Filtered>,
    command_line: CommandLine,
    /// What is in force now, so an unchanged reload changes nothing, and whether the config
    /// file was applied yet.
    current: Mutex<(LogFormat, LogLevel, bool)>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// A text writer that keeps one event one line and lets no terminal escape through: each
/// control character in what is written (a `\n` or an ESC in a pod's name from the kubelet,
/// a multi-line error) becomes its `\u{..}` text, except the newline that ends the event.
/// JSON lines are escaped by their encoder already.
struct Escaped<M>(M);

/// [`Escaped`]'s writer.
struct EscapedWriter<W>(W);

impl<'w, M: MakeWriter<'w>> MakeWriter<'w> for Escaped<M> {
    type Writer = EscapedWriter<M::Writer>;
    fn make_writer(&'w self) -> Self::Writer {
        EscapedWriter(self.0.make_writer())
    }
}

impl<W: std::io::Write> std::io::Write for EscapedWriter<W> {
    /// The formatter writes each event whole, ending in its newline.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match bytes.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (bytes, &b""[..]),
        };
        if !body.iter().any(|b| b.is_ascii_control()) {
            self.0.write_all(bytes)?;
            return Ok(bytes.len());
        }
        let mut out = Vec::with_capacity(bytes.len() + 16);
        for &b in body {
            if b.is_ascii_control() {
                out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes());
            } else {
                out.push(b);
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A formatter writing to `writer`, in `format`. Text is escaped ([`Escaped`]), and so
/// carries no colours: the ANSI codes are control characters too.
fn formatter<W>(format: LogFormat, writer: W) -> Formatter
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    match format {
        LogFormat::Text => Box::new(
            tracing_subscriber::fmt::layer()
                .with_writer(Escaped(writer))
                .with_ansi(false),
        ),
        // No span fields: the agent logs events, and a span's fields formatted by the text
        // layer before a switch would not be the JSON layer's.
        LogFormat::Json => Box::new(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_writer(writer),
        ),
    }
}

/// Installs the process's subscriber on stderr: the command line's format and level, else
/// text and `default_level` until [`configure`] applies the config file's.
pub fn init(command_line: CommandLine, default_level: &str) {
    let format = command_line.format.unwrap_or_default();
    let level = command_line
        .level
        .clone()
        .or_else(|| default_level.parse().ok())
        .unwrap_or_default();
    let (formatter_layer, formatter) = reload::Layer::new(self::formatter(format, std::io::stderr));
    let (filter_layer, filter) = reload::Layer::new(level.filter());
    let installed = tracing_subscriber::registry()
        .with(formatter_layer)
        .with(filter_layer)
        .try_init()
        .is_ok();
    if installed {
        let _ = INSTALLED.set(Installed {
            formatter,
            filter,
            command_line,
            current: Mutex::new((format, level, false)),
        });
    }
}

/// Applies the config file's `logFormat` and `logLevel`, each unless the command line fixed
/// it; says so when either changes. Nothing happens before [`init`].
pub fn configure(format: LogFormat, level: &LogLevel) {
    let Some(installed) = INSTALLED.get() else {
        return;
    };
    let (format, level) = installed.command_line.over(format, level);
    let mut current = installed
        .current
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // The first time is the file read at start: it sets the format and level every line of
    // the run is written in, unannounced. A reload that changes them says so.
    let first = !std::mem::replace(&mut current.2, true);
    if current.1 != level {
        match installed.filter.reload(level.filter()) {
            Ok(()) => {
                let was = std::mem::replace(&mut current.1, level);
                if !first {
                    tracing::info!(log_level = %current.1, %was, "log level changed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "the log level could not be changed"),
        }
    }
    if current.0 != format {
        match installed
            .formatter
            .reload(self::formatter(format, std::io::stderr))
        {
            Ok(()) => {
                let was = std::mem::replace(&mut current.0, format);
                // In the new format: what reads the stream sees why the lines changed.
                if !first {
                    tracing::info!(log_format = %format, %was, "log format changed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "the log format could not be changed"),
        }
    }
}

/// Whether lines are JSON now: a fatal error is then written as one more JSON line.
pub fn is_json() -> bool {
    INSTALLED.get().is_some_and(|installed| {
        installed
            .current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
            == LogFormat::Json
    })
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        io::Write,
        sync::{Arc, Mutex},
    };

    use super::*;

    #[test]
    fn directives_for_the_old_daemon_targets_select_the_same_modules() {
        for (written, meant) in [
            ("info", "info"),
            ("info,node_agent=debug", "info,node_agent=debug"),
            (
                "info,node_agent::daemon=debug",
                "info,node_agent::run=debug,node_agent::config=debug,node_agent::observe=debug,\
                 node_agent::serve=debug,node_agent::check_config=debug",
            ),
            (
                "warn,node_agent::daemon::report=trace",
                "warn,node_agent::run::report=trace",
            ),
            (
                "node_agent::daemon::probe=debug,node_agent::daemon::config::plausible=info",
                "node_agent::observe::fs_probe=debug,node_agent::config::plausible=info",
            ),
            (
                "node_agent::daemon::pods[eviction]=debug",
                "node_agent::observe::pods[eviction]=debug",
            ),
            ("node_agent::daemonic=debug", "node_agent::daemonic=debug"),
        ] {
            assert_eq!(retargeted(written), meant, "{written}");
            let level: LogLevel = written.parse().unwrap();
            let _ = level.filter();
        }
    }

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Self;
        fn make_writer(&'w self) -> Self {
            self.clone()
        }
    }

    /// What one eviction line (as the daemon's report logs it) looks like in `format`.
    fn eviction_line(format: LogFormat) -> String {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(formatter(format, buffer.clone()))
            .with(LogLevel::info().filter());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                pod = %"shop/web",
                signal = %"memory.available",
                result = "evicted",
                reason = "",
                "eviction"
            );
            tracing::debug!("below the level: not written");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        text
    }

    #[test]
    fn a_text_line_carries_no_control_character_but_its_end() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(formatter(LogFormat::Text, buffer.clone()))
            .with(LogLevel::info().filter());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(pod = %"shop/web\n2026-01-01T00:00:00Z  INFO forged", "eviction");
            tracing::warn!(pod = %"shop/\u{1b}[2Jweb", error = "a\r\tb", "not recorded");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text:?}");
        assert!(
            text.trim_end_matches('\n')
                .split('\n')
                .all(|l| !l.chars().any(|c| c.is_ascii_control())),
            "{text:?}"
        );
        assert!(text.contains(r"shop/web\u{a}2026-01-01"), "{text:?}");
        assert!(text.contains(r"shop/\u{1b}[2Jweb"), "{text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
    }

    /// The `key=value` fields of a text line (values without spaces here).
    fn text_fields(line: &str) -> BTreeMap<String, String> {
        line.split_whitespace()
            .filter_map(|word| word.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect()
    }

    #[test]
    fn a_json_line_carries_the_fields_of_the_text_line_and_its_header() {
        let text = eviction_line(LogFormat::Text);
        let json: serde_json::Value =
            serde_json::from_str(eviction_line(LogFormat::Json).trim()).unwrap();
        let object = json.as_object().unwrap();
        let fields = text_fields(&text);
        assert_eq!(
            fields.keys().collect::<Vec<_>>(),
            ["pod", "reason", "result", "signal"],
            "{text}"
        );
        for (key, value) in &fields {
            assert_eq!(object[key], value.as_str(), "{key} in {json} and {text}");
        }
        assert_eq!(json["message"], "eviction");
        assert_eq!(json["level"], "INFO");
        assert_eq!(json["target"], module_path!());
        assert!(
            text.contains(" INFO ") && text.contains("eviction"),
            "{text}"
        );
        let timestamp = json["timestamp"].as_str().unwrap();
        assert!(
            timestamp.parse::<jiff::Timestamp>().is_ok(),
            "RFC 3339: {timestamp}"
        );
        // Nothing but the header and the event's own fields.
        let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "level",
                "message",
                "pod",
                "reason",
                "result",
                "signal",
                "target",
                "timestamp"
            ]
        );
    }

    #[test]
    fn the_command_line_wins_over_the_file_each_setting_on_its_own() {
        let debug: LogLevel = "debug".parse().unwrap();
        let warn: LogLevel = "warn".parse().unwrap();
        let table = [
            (
                None,
                None,
                (LogFormat::Json, warn.clone()),
                "the file alone",
            ),
            (
                Some(LogFormat::Text),
                None,
                (LogFormat::Text, warn.clone()),
                "the format flag",
            ),
            (
                None,
                Some(debug.clone()),
                (LogFormat::Json, debug.clone()),
                "the level flag or RUST_LOG",
            ),
            (
                Some(LogFormat::Text),
                Some(debug.clone()),
                (LogFormat::Text, debug.clone()),
                "both flags",
            ),
        ];
        for (format, level, want, behaviour) in table {
            let command_line = CommandLine { format, level };
            assert_eq!(
                command_line.over(LogFormat::Json, &warn),
                want,
                "{behaviour}"
            );
        }
    }

    #[test]
    fn levels_and_directives_are_checked_when_read() {
        for good in ["info", "debug", "warn,node_agent=trace", " error ", "off"] {
            assert_eq!(
                good.parse::<LogLevel>().map(|l| l.to_string()),
                Ok(good.trim().to_string())
            );
        }
        for bad in [
            "",
            "  ",
            "loud",
            "inof",
            "info,node_agent",
            "node_agent=verbose",
        ] {
            let err = bad.parse::<LogLevel>().unwrap_err().to_string();
            assert!(
                err.contains("is not a log level or filter: expected error, warn, info"),
                "{bad:?}: {err}"
            );
        }
        // RUST_LOG keeps EnvFilter's meaning of a bare word: that target at every level.
        assert!(LogLevel::from_rust_log("node_agent,kube=warn").is_ok());
        assert!(LogLevel::from_rust_log("node_agent=verbose").is_err());
        let from_yaml: Result<LogLevel, _> = serde_yaml_ng::from_str("loud");
        assert!(from_yaml.is_err());
        assert_eq!(
            serde_yaml_ng::from_str::<LogFormat>("json").unwrap(),
            LogFormat::Json
        );
        assert!(serde_yaml_ng::from_str::<LogFormat>("yaml").is_err());
    }
}
