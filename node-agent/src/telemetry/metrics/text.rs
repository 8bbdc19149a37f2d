//! The two expositions `/metrics` speaks, and which one a scraper asked for.
//!
//! `prometheus-client` writes only OpenMetrics 1.0.0. Prometheus before 2.5 and `promtool check
//! metrics`, and anything that sends `Accept: text/plain` or nothing, read the Prometheus text
//! format 0.0.4, where a counter's family is named with its `_total`, there is no `# UNIT`,
//! no `_created` sample and no `# EOF`. [`openmetrics_to_text`] rewrites the one into the
//! other (our own code: the crate has no 0.0.4 encoder); it is a pure function of the text.

/// Which exposition a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0, as `prometheus-client` writes it.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format for an `Accept` header (`None`: no header). Media ranges are tried by
    /// falling quality (`q`, 1 when absent; 0 or unreadable: not acceptable), in header order
    /// among equals, as Prometheus' own client does: `application/openmetrics-text` (version
    /// 1.0.0 or none) → OpenMetrics; `text/plain` (version 0.0.4 or none), `text/*`, `*/*` →
    /// text. Nothing acceptable, or no header → text, the format every scraper reads.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut ranges: Vec<(f32, Option<Format>)> = accept
            .split(',')
            .filter_map(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next()?.to_ascii_lowercase();
                let mut q = 1.0_f32;
                let mut version = None;
                for param in parts {
                    let (key, value) = param.split_once('=')?;
                    let value = value.trim().trim_matches('"');
                    match key.trim().to_ascii_lowercase().as_str() {
                        "q" => {
                            q = value
                                .parse()
                                .ok()
                                .filter(|q: &f32| (0.0..=1.0).contains(q))?
                        }
                        "version" => version = Some(value.to_owned()),
                        _ => {}
                    }
                }
                let format = match (media.as_str(), version.as_deref()) {
                    ("application/openmetrics-text", None | Some("1.0.0")) => {
                        Some(Format::OpenMetrics)
                    }
                    ("text/plain", None | Some("0.0.4")) | ("text/*" | "*/*", _) => {
                        Some(Format::Text)
                    }
                    _ => None,
                };
                (q > 0.0).then_some((q, format))
            })
            .collect();
        // Stable: equal qualities keep the header's order.
        ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranges
            .into_iter()
            .find_map(|(_, format)| format)
            .unwrap_or(Format::Text)
    }
}

/// The OpenMetrics text was not what `prometheus-client` writes (a bug of ours, never input
/// from outside): the scrape fails rather than serving a half-converted exposition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("line {line}: {why}: {text:?}")]
    Line {
        line: usize,
        text: String,
        why: &'static str,
    },
    #[error("family {family}: OpenMetrics type {kind:?} has no 0.0.4 equivalent")]
    UnsupportedType { family: String, kind: String },
    #[error("the exposition does not end with `# EOF`")]
    MissingEof,
}

/// What may follow a family's name in its samples' names.
const SUFFIXES: [&str; 7] = [
    "", "_total", "_created", "_bucket", "_sum", "_count", "_info",
];

struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    samples: Vec<&'a str>,
}

/// Rewrites OpenMetrics text into the Prometheus text format 0.0.4: counter families take the
/// `_total` their samples carry, `info` becomes a gauge named with `_info`, `unknown` becomes
/// `untyped`; `# UNIT` lines, `_created` samples and exemplars go, and so does `# EOF`.
/// Every family keeps its `# HELP` and `# TYPE`. Help text is escaped as 0.0.4 wants
/// (backslash and newline).
pub fn openmetrics_to_text(openmetrics: &str) -> Result<String, ConvertError> {
    let mut families: Vec<Family> = Vec::new();
    let mut eof = false;
    for (index, text) in openmetrics.lines().enumerate() {
        let err = |why| ConvertError::Line {
            line: index + 1,
            text: text.to_owned(),
            why,
        };
        if eof {
            return Err(err("text after `# EOF`"));
        }
        if text == "# EOF" {
            eof = true;
        } else if let Some(rest) = text.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name,
                help,
                kind: "unknown",
                samples: Vec::new(),
            });
        } else if let Some(rest) = text.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without a type"))?;
            match families.last_mut() {
                Some(family) if family.name == name => family.kind = kind,
                _ => families.push(Family {
                    name,
                    help: "",
                    kind,
                    samples: Vec::new(),
                }),
            }
        } else if text.starts_with("# UNIT ") || text.is_empty() {
        } else if text.starts_with('#') {
            return Err(err("a comment OpenMetrics does not have"));
        } else {
            let family = families
                .last_mut()
                .ok_or_else(|| err("a sample before any family"))?;
            let name_end = text
                .find(['{', ' '])
                .ok_or_else(|| err("a sample without value"))?;
            let suffix = text[..name_end]
                .strip_prefix(family.name)
                .filter(|suffix| SUFFIXES.contains(suffix))
                .ok_or_else(|| err("a sample of another family"))?;
            if suffix == "_created" {
                continue;
            }
            family.samples.push(
                without_exemplar(text, name_end)
                    .ok_or_else(|| err("a sample with a timestamp or unbalanced labels"))?,
            );
        }
    }
    if !eof {
        return Err(ConvertError::MissingEof);
    }
    let mut out = String::with_capacity(openmetrics.len());
    for family in families {
        let (name, kind) = match family.kind {
            "counter" => (format!("{}_total", family.name), "counter"),
            "info" => (format!("{}_info", family.name), "gauge"),
            "unknown" => (family.name.to_owned(), "untyped"),
            kind @ ("gauge" | "histogram" | "summary") => (family.name.to_owned(), kind),
            other => {
                return Err(ConvertError::UnsupportedType {
                    family: family.name.to_owned(),
                    kind: other.to_owned(),
                })
            }
        };
        let help = family.help.replace('\\', r"\\").replace('\n', r"\n");
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for sample in family.samples {
            out.push_str(sample);
            out.push('\n');
        }
    }
    Ok(out)
}

/// The sample line up to its value: an exemplar (` # {…} v`) dropped. `None` when the label
/// set does not close or a timestamp follows the value (we never write one; its unit differs
/// between the formats).
fn without_exemplar(line: &str, name_end: usize) -> Option<&str> {
    let mut labels_end = name_end;
    if line[name_end..].starts_with('{') {
        let (mut quoted, mut escaped) = (false, false);
        let close = line[name_end..].char_indices().find(|&(_, c)| {
            let closes = !quoted && c == '}';
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                _ => {}
            }
            closes
        })?;
        labels_end = name_end + close.0 + 1;
    }
    let rest = &line[labels_end..];
    let value_part = rest.split(" # ").next().unwrap_or(rest);
    let mut tokens = value_part.split_whitespace();
    tokens.next()?;
    if tokens.next().is_some() {
        return None;
    }
    Some(line[..labels_end + value_part.len()].trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_the_accept_header() {
        #[rustfmt::skip]
        let rows: &[(&str, Option<&str>, Format)] = &[
            ("no header: text", None, Format::Text),
            ("empty header: text", Some(""), Format::Text),
            ("OpenMetrics asked", Some("application/openmetrics-text"), Format::OpenMetrics),
            ("OpenMetrics 1.0.0 asked", Some("application/openmetrics-text; version=1.0.0; charset=utf-8"), Format::OpenMetrics),
            ("media type case-insensitive", Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            ("text 0.0.4 asked (promtool, old Prometheus)", Some("text/plain; version=0.0.4"), Format::Text),
            ("anything", Some("*/*"), Format::Text),
            ("Prometheus 2.x with OpenMetrics preferred",
             Some("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"),
             Format::OpenMetrics),
            ("text preferred by quality", Some("application/openmetrics-text;q=0.3, text/plain;version=0.0.4;q=0.9"), Format::Text),
            ("equal quality: header order", Some("text/plain, application/openmetrics-text"), Format::Text),
            ("q=0 refuses OpenMetrics", Some("application/openmetrics-text;q=0"), Format::Text),
            ("an OpenMetrics version we do not write", Some("application/openmetrics-text; version=0.0.1"), Format::Text),
            ("an unreadable quality is not acceptable", Some("application/openmetrics-text;q=high"), Format::Text),
            ("an unknown type alone: text", Some("application/json"), Format::Text),
            ("unknown then OpenMetrics", Some("application/json, application/openmetrics-text;q=0.1"), Format::OpenMetrics),
        ];
        for (name, accept, expected) in rows {
            assert_eq!(Format::negotiate(*accept), *expected, "{name}");
        }
    }

    #[test]
    fn openmetrics_becomes_text_0_0_4() {
        #[rustfmt::skip]
        let rows: &[(&str, &str, &str)] = &[
            ("a counter family takes its _total and loses _created",
             "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{code=\"200\"} 3\na_requests_created{code=\"200\"} 1700000000.0\n# EOF\n",
             "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{code=\"200\"} 3\n"),
            ("a gauge is unchanged",
             "# HELP g Gauge.\n# TYPE g gauge\ng 5\n# EOF\n",
             "# HELP g Gauge.\n# TYPE g gauge\ng 5\n"),
            ("a unit line goes",
             "# HELP d_seconds Latency.\n# TYPE d_seconds histogram\n# UNIT d_seconds seconds\nd_seconds_sum 0.5\nd_seconds_count 1\nd_seconds_bucket{le=\"+Inf\"} 1\n# EOF\n",
             "# HELP d_seconds Latency.\n# TYPE d_seconds histogram\nd_seconds_sum 0.5\nd_seconds_count 1\nd_seconds_bucket{le=\"+Inf\"} 1\n"),
            ("an empty family keeps HELP and TYPE",
             "# HELP e Empty.\n# TYPE e counter\n# EOF\n",
             "# HELP e_total Empty.\n# TYPE e_total counter\n"),
            ("info becomes a gauge named _info",
             "# HELP b Build.\n# TYPE b info\nb_info{version=\"1\"} 1\n# EOF\n",
             "# HELP b_info Build.\n# TYPE b_info gauge\nb_info{version=\"1\"} 1\n"),
            ("unknown becomes untyped",
             "# HELP u What.\n# TYPE u unknown\nu 1\n# EOF\n",
             "# HELP u What.\n# TYPE u untyped\nu 1\n"),
            ("an exemplar goes",
             "# HELP c C.\n# TYPE c counter\nc_total 2 # {trace_id=\"x # y\"} 1.0\n# EOF\n",
             "# HELP c_total C.\n# TYPE c_total counter\nc_total 2\n"),
            ("label values with braces, quotes and ' # ' are kept whole",
             "# HELP c C.\n# TYPE c counter\nc_total{l=\"a} # \\\"b\\\\\"} 1\n# EOF\n",
             "# HELP c_total C.\n# TYPE c_total counter\nc_total{l=\"a} # \\\"b\\\\\"} 1\n"),
            ("help is escaped for 0.0.4",
             "# HELP h A \\ slash.\n# TYPE h gauge\n# EOF\n",
             "# HELP h A \\\\ slash.\n# TYPE h gauge\n"),
            ("nothing at all",
             "# EOF\n",
             ""),
        ];
        for (name, input, expected) in rows {
            assert_eq!(
                openmetrics_to_text(input).as_deref(),
                Ok(*expected),
                "{name}"
            );
        }
    }

    #[test]
    fn what_prometheus_client_never_writes_is_an_error() {
        #[rustfmt::skip]
        let rows: &[(&str, &str, &str)] = &[
            ("no EOF", "# HELP g G.\n# TYPE g gauge\ng 1\n", "does not end"),
            ("text after EOF", "# EOF\ng 1\n", "after `# EOF`"),
            ("a sample before any family", "g 1\n# EOF\n", "before any family"),
            ("a sample of another family", "# HELP g G.\n# TYPE g gauge\nh 1\n# EOF\n", "another family"),
            ("a sample of a longer-named family", "# HELP g G.\n# TYPE g gauge\ngx 1\n# EOF\n", "another family"),
            ("a timestamp", "# HELP g G.\n# TYPE g gauge\ng 1 1700000000\n# EOF\n", "timestamp"),
            ("unclosed labels", "# HELP g G.\n# TYPE g gauge\ng{a=\"1\" 1\n# EOF\n", "unbalanced"),
            ("a stateset", "# HELP s S.\n# TYPE s stateset\n# EOF\n", "stateset"),
            ("a stray comment", "# random\n# EOF\n", "comment"),
        ];
        for (name, input, needle) in rows {
            let error = openmetrics_to_text(input).expect_err(name).to_string();
            assert!(error.contains(needle), "{name}: {error}");
        }
    }
}
